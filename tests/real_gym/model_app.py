"""A NeMo Gym 0.7.0 model server (``SimpleResponsesAPIModel``) that answers without a model.

Copied as ``app.py`` into a temporary folder and started the way Gym starts a server. It
answers every ``/v1/responses`` call with one assistant message ("yes"), except:
  - a judge prompt (input starting ``Task:``) that mentions ``judge-down`` gets a 503: a judge
    provider in trouble;
  - any other input that mentions ``model-down`` gets a 500: the policy model failing.
"""

from fastapi import HTTPException
from nemo_gym.base_responses_api_model import BaseResponsesAPIModelConfig, SimpleResponsesAPIModel
from nemo_gym.openai_utils import (
    NeMoGymChatCompletion,
    NeMoGymChatCompletionCreateParamsNonStreaming,
    NeMoGymResponse,
    NeMoGymResponseCreateParamsNonStreaming,
)


class CannedModelConfig(BaseResponsesAPIModelConfig):
    pass


class CannedModel(SimpleResponsesAPIModel):
    ray_enabled = False
    config: CannedModelConfig

    async def responses(self, body: NeMoGymResponseCreateParamsNonStreaming) -> NeMoGymResponse:
        text = str(body.input)
        judge = isinstance(body.input, str) and body.input.startswith("Task:")
        if judge and "judge-down" in text:
            raise HTTPException(status_code=503, detail="judge provider unavailable")
        if not judge and "model-down" in text:
            raise HTTPException(status_code=500, detail="policy model failed")
        return NeMoGymResponse(
            id="resp_canned",
            created_at=0,
            model="canned",
            object="response",
            output=[
                {
                    "id": "msg_canned",
                    "type": "message",
                    "role": "assistant",
                    "status": "completed",
                    "content": [{"type": "output_text", "text": "yes", "annotations": []}],
                }
            ],
            parallel_tool_calls=False,
            tool_choice="auto",
            tools=[],
        )

    async def chat_completions(self, body: NeMoGymChatCompletionCreateParamsNonStreaming) -> NeMoGymChatCompletion:
        raise HTTPException(status_code=501, detail="only /v1/responses")


if __name__ == "__main__":
    CannedModel.run_webserver()
