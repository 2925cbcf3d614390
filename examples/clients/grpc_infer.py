"""Call the example models over gRPC with tritonclient (KServe v2 GRPCInferenceService).

    pip install "tritonclient[grpc]" numpy
    naiad serve --model-repository examples/models
    python examples/clients/grpc_infer.py [--url localhost:8001]
"""

import argparse

import numpy as np
import tritonclient.grpc as grpcclient

parser = argparse.ArgumentParser()
parser.add_argument("--url", default="localhost:8001", help="host:port of the gRPC endpoint")
args = parser.parse_args()

client = grpcclient.InferenceServerClient(url=args.url)
print("server live:", client.is_server_live(), "| add_sub ready:", client.is_model_ready("add_sub"))
meta = client.get_model_metadata("add_sub", as_json=True)
print("add_sub inputs:", [(t["name"], t["datatype"], t["shape"]) for t in meta["inputs"]])

# add_sub: two FP32 [16] vectors in, their sum and difference out (batch of 1 -> shape [1, 16]).
a = np.arange(16, dtype=np.float32).reshape(1, 16)
b = np.ones((1, 16), dtype=np.float32)
inputs = [grpcclient.InferInput("INPUT0", [1, 16], "FP32"), grpcclient.InferInput("INPUT1", [1, 16], "FP32")]
inputs[0].set_data_from_numpy(a)
inputs[1].set_data_from_numpy(b)
result = client.infer("add_sub", inputs, outputs=[grpcclient.InferRequestedOutput("OUTPUT0"),
                                                  grpcclient.InferRequestedOutput("OUTPUT1")])
assert np.array_equal(result.as_numpy("OUTPUT0"), a + b)
assert np.array_equal(result.as_numpy("OUTPUT1"), a - b)
print("add_sub OUTPUT0:", result.as_numpy("OUTPUT0")[0, :4], "... OUTPUT1:", result.as_numpy("OUTPUT1")[0, :4], "...")

# mlp_classifier: top-3 classes with their labels.
x = np.random.default_rng(0).standard_normal((2, 256)).astype(np.float32)
inp = grpcclient.InferInput("INPUT", list(x.shape), "FP32")
inp.set_data_from_numpy(x)
result = client.infer("mlp_classifier", [inp], outputs=[grpcclient.InferRequestedOutput("PROBABILITIES", class_count=3)])
for row in result.as_numpy("PROBABILITIES"):  # BYTES entries "<score>:<index>:<label>"
    print("mlp_classifier top-3:", [entry.decode() for entry in row])

# string_upper: BYTES tensors in and out.
words = np.array([b"hello", b"naiad"], dtype=np.object_)
inp = grpcclient.InferInput("INPUT", [len(words)], "BYTES")
inp.set_data_from_numpy(words)
result = client.infer("string_upper", [inp])
print("string_upper:", [w.decode() for w in result.as_numpy("OUTPUT")])
