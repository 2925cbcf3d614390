"""Call the example models over HTTP/REST with tritonclient (KServe v2 protocol).

    pip install "tritonclient[http]" numpy
    naiad serve --model-repository examples/models
    python examples/clients/http_infer.py [--url localhost:8000]
"""

import argparse

import numpy as np
import tritonclient.http as httpclient

parser = argparse.ArgumentParser()
parser.add_argument("--url", default="localhost:8000", help="host:port of the HTTP endpoint")
args = parser.parse_args()

client = httpclient.InferenceServerClient(url=args.url)
print("server live:", client.is_server_live(), "| add_sub ready:", client.is_model_ready("add_sub"))

# add_sub: two FP32 [16] vectors in, their sum and difference out (batch of 1 -> shape [1, 16]).
a = np.arange(16, dtype=np.float32).reshape(1, 16)
b = np.ones((1, 16), dtype=np.float32)
inputs = [httpclient.InferInput("INPUT0", [1, 16], "FP32"), httpclient.InferInput("INPUT1", [1, 16], "FP32")]
inputs[0].set_data_from_numpy(a)  # binary_data=True by default: raw bytes after the JSON header
inputs[1].set_data_from_numpy(b, binary_data=False)  # sent as a JSON list instead
outputs = [httpclient.InferRequestedOutput("OUTPUT0"), httpclient.InferRequestedOutput("OUTPUT1", binary_data=False)]
result = client.infer("add_sub", inputs, outputs=outputs)
assert np.array_equal(result.as_numpy("OUTPUT0"), a + b)
assert np.array_equal(result.as_numpy("OUTPUT1"), a - b)
print("add_sub OUTPUT0:", result.as_numpy("OUTPUT0")[0, :4], "... OUTPUT1:", result.as_numpy("OUTPUT1")[0, :4], "...")

# mlp_classifier: ask for the top-3 classes instead of the raw probabilities (labels come from labels.txt).
x = np.random.default_rng(0).standard_normal((2, 256)).astype(np.float32)
inp = httpclient.InferInput("INPUT", list(x.shape), "FP32")
inp.set_data_from_numpy(x)
result = client.infer("mlp_classifier", [inp], outputs=[httpclient.InferRequestedOutput("PROBABILITIES", class_count=3)])
for row in result.as_numpy("PROBABILITIES"):  # BYTES entries "<score>:<index>:<label>"
    print("mlp_classifier top-3:", [entry.decode() for entry in row])

# string_upper: BYTES tensors in and out.
words = np.array([b"hello", b"naiad"], dtype=np.object_)
inp = httpclient.InferInput("INPUT", [len(words)], "BYTES")
inp.set_data_from_numpy(words)
result = client.infer("string_upper", [inp])
print("string_upper:", [w.decode() for w in result.as_numpy("OUTPUT")])
