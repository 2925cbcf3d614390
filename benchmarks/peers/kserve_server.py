"""KServe ModelServer serving ONNX files with onnxruntime and XGBoost JSON files with xgboost
(peer for Naiad's benchmarks).

Runs inside the KServe venv made by benchmarks/setup_peers.sh:
    python kserve_server.py --http_port 8080 --grpc_port 8081 \
        --model add_sub=/path/add_sub.onnx --model mlp_classifier=/path/mlp.onnx
(other --flags are KServe's own ModelServer flags). This is the ordinary way to serve a custom
model with KServe's v2 protocol: a kserve.Model whose predict() takes an InferRequest and returns
an InferResponse. A path ending in .json is an XGBoost model answering `output__0` (the
probability, one column; xgboost must be installed in the venv). One thread, like the other
servers; per-request latency logging and uvicorn access logs are off so the server is not timed
writing logs.
"""

import argparse
import logging
import sys
import uuid

import onnxruntime as ort


def _split_own_args(argv):
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--model", action="append", default=[], metavar="NAME=PATH")
    own, rest = parser.parse_known_args(argv)
    if not own.model:
        sys.exit("kserve_server.py: give at least one --model NAME=PATH")
    return [tuple(item.split("=", 1)) for item in own.model], rest


MODELS, sys.argv[1:] = _split_own_args(sys.argv[1:])  # kserve parses sys.argv when imported

import kserve  # noqa: E402
from kserve import InferOutput, InferRequest, InferResponse  # noqa: E402
from kserve.utils.utils import from_np_dtype  # noqa: E402


class OnnxRuntimeModel(kserve.Model):
    def __init__(self, name: str, path: str):
        super().__init__(name)
        self.path = path
        self.load()

    def load(self) -> bool:
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        self.session = ort.InferenceSession(self.path, options, providers=["CPUExecutionProvider"])
        self.output_names = [o.name for o in self.session.get_outputs()]
        self.ready = True
        return self.ready

    def run(self, feeds: dict) -> list:
        return self.session.run(self.output_names, feeds)

    def predict(self, payload: InferRequest, headers=None) -> InferResponse:
        results = self.run({i.name: i.as_numpy() for i in payload.inputs})
        outputs = []
        for name, value in zip(self.output_names, results):
            output = InferOutput(name=name, shape=list(value.shape), datatype=from_np_dtype(value.dtype))
            output.set_data_from_numpy(value, binary_data=payload.use_binary_outputs)
            outputs.append(output)
        return InferResponse(
            response_id=payload.id or str(uuid.uuid4()),  # the REST response model needs an id
            model_name=self.name,
            infer_outputs=outputs,
            from_grpc=payload.from_grpc,
            use_binary_outputs=payload.use_binary_outputs,
            requested_outputs=payload.request_outputs,
        )


class XGBoostModel(OnnxRuntimeModel):
    def load(self) -> bool:
        import xgboost as xgb

        self.booster = xgb.Booster()
        self.booster.load_model(self.path)
        self.booster.set_param({"nthread": 1})
        self.output_names = ["output__0"]
        self.ready = True
        return self.ready

    def run(self, feeds: dict) -> list:
        x = next(iter(feeds.values())).astype("float32", copy=False)
        return [self.booster.inplace_predict(x, validate_features=False).astype("float32").reshape(-1, 1)]


if __name__ == "__main__":
    models = [(XGBoostModel if path.endswith(".json") else OnnxRuntimeModel)(name, path) for name, path in MODELS]
    server = kserve.ModelServer(enable_latency_logging=False)
    logging.getLogger("uvicorn.access").setLevel(logging.WARNING)
    server.start(models)
