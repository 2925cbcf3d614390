"""MLServer custom runtime serving one ONNX file with onnxruntime (peer for Naiad's benchmark).

Runs inside the MLServer venv made by benchmarks/setup_peers.sh. model-settings.json:
    {"name": "add_sub", "implementation": "mlserver_runtime.OnnxRuntimeModel",
     "parameters": {"uri": "/path/to/model.onnx"}}
This is the ordinary way to serve a custom model with MLServer: decode the v2 inputs with
NumpyCodec, call the framework, encode the outputs. One ORT thread, like the other servers.
"""

import numpy as np
import onnxruntime as ort
from mlserver import MLModel
from mlserver.codecs import NumpyCodec
from mlserver.types import InferenceRequest, InferenceResponse


class OnnxRuntimeModel(MLModel):
    async def load(self) -> bool:
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        self._session = ort.InferenceSession(
            self.settings.parameters.uri, options, providers=["CPUExecutionProvider"]
        )
        self._input_types = {i.name: i.type for i in self._session.get_inputs()}
        self._output_names = [o.name for o in self._session.get_outputs()]
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        feeds = {}
        for request_input in payload.inputs:
            array = NumpyCodec.decode_input(request_input)
            if self._input_types.get(request_input.name) == "tensor(float)":
                array = np.asarray(array, dtype=np.float32)
            feeds[request_input.name] = array
        results = self._session.run(self._output_names, feeds)
        return InferenceResponse(
            model_name=self.name,
            model_version=self.version,
            id=payload.id,
            outputs=[NumpyCodec.encode_output(name, value) for name, value in zip(self._output_names, results)],
        )


class XGBoostBoosterModel(MLModel):
    """An XGBoost JSON model (parameters.uri) answering `output__0` (the probability, one column),
    the names Triton's FIL convention uses, so every server is driven with the same request."""

    async def load(self) -> bool:
        import xgboost as xgb

        self._booster = xgb.Booster()
        self._booster.load_model(self.settings.parameters.uri)
        self._booster.set_param({"nthread": 1})
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        x = np.asarray(NumpyCodec.decode_input(payload.inputs[0]), dtype=np.float32)
        y = self._booster.inplace_predict(x, validate_features=False).astype(np.float32).reshape(-1, 1)
        return InferenceResponse(model_name=self.name, model_version=self.version, id=payload.id,
                                 outputs=[NumpyCodec.encode_output("output__0", y)])
