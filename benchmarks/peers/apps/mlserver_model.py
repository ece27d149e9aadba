"""MLServer: a custom runtime (MLModel) behind its V2 REST API; adaptive batching (max_batch_size, max_batch_time)
and parallel_workers come from settings.json / model-settings.json."""

from __future__ import annotations

import json

from common import Model
from mlserver import MLModel
from mlserver.codecs import StringCodec
from mlserver.types import InferenceRequest, InferenceResponse


class PeerModel(MLModel):
    async def load(self) -> bool:
        self.model = Model()
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        bodies = StringCodec.decode_input(payload.inputs[0])
        answers = [json.dumps(a) for a in self.model.predict(bodies)]
        return InferenceResponse(model_name=self.name, outputs=[StringCodec.encode_output("output", answers)])
