"""A NeMo Gym 0.7.0 resources server (``SimpleResourcesServer``) with a judge, a route that
raises an ``NgFailureEvent`` and a healthy route.

Copied as ``app.py`` into a temporary folder and started the way Gym starts a server, so the
app is built by Gym's own ``run_webserver``: session and rollout-context middleware,
``judge_failsafe`` around ``/verify``, the catch-all exception middleware, the cancellation
middleware. ``verify`` asks the judge model through Gym's ``call_judge``; a failed call is a
``JudgeError`` that ``judge_failsafe`` turns into a masked reply. The judge is told
``judge-down`` when the task's input says so (the canned model then answers 503).
"""

from nemo_gym.base_resources_server import (
    BaseResourcesServerConfig,
    BaseVerifyRequest,
    BaseVerifyResponse,
    SimpleResourcesServer,
)
from nemo_gym.config_types import ModelServerRef
from nemo_gym.judge import call_judge
from nemo_gym.openai_utils import NeMoGymResponse
from pydantic import BaseModel

from ng_otel import NgFailureEvent

RAISED_KIND = "real_gym:lookup_failed"


class JudgedConfig(BaseResourcesServerConfig):
    judge_model_server: ModelServerRef


class LookupRequest(BaseModel):
    city: str


class LookupResponse(BaseModel):
    city: str
    weather: str


class JudgedResourcesServer(SimpleResourcesServer):
    ray_enabled = False
    config: JudgedConfig

    def setup_webserver(self):
        app = super().setup_webserver()
        app.post("/lookup")(self.lookup)
        app.post("/lookup_broken")(self.lookup_broken)
        return app

    async def lookup(self, body: LookupRequest) -> LookupResponse:
        return LookupResponse(city=body.city, weather=f"The weather in {body.city} is cold.")

    async def lookup_broken(self, body: LookupRequest) -> LookupResponse:
        raise NgFailureEvent(
            RAISED_KIND,
            f"the weather service has no data for {body.city}",
            boundary="resources_server",
            stage="agent",
            http_status=503,
            operation="lookup",
        )

    async def verify(self, body: BaseVerifyRequest) -> BaseVerifyResponse:
        task = str(body.responses_create_params.input)
        verdict = await call_judge(
            self.server_client,
            server_name=self.config.judge_model_server.name,
            url_path="/v1/responses",
            json={"input": f"Task: {task}\nAnswer: {body.response.output_text}\nIs the answer right?"},
            response_model=NeMoGymResponse,
        )
        reward = 1.0 if verdict.output_text.strip().lower().startswith("yes") else 0.0
        return BaseVerifyResponse(**body.model_dump(), reward=reward)


if __name__ == "__main__":
    JudgedResourcesServer.run_webserver()
