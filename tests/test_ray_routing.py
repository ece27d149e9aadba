"""Which version a request means on Ray, and what a failed handle call answers: the driver (``RayBackend``), the
frontend (``FrontendView``) and a model's ingress replica (``ModelReplica``, its handler loaded in this process) built
from the args the Serve config ships, in-process. Ray's deployment handles are the seam: a stand-in answers as the
version's replicas would, or raises the Ray error a dead replica, a deleted deployment or a full queue raises. The
same paths on a real cluster: tests/test_ray_serve.py and the [ray] variants of the API suites."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest

pytest.importorskip("ray.serve", reason="Ray Serve is not installed (pip install 'servetune[ray]')")

from ray.exceptions import RayActorError  # noqa: E402
from ray.serve.exceptions import BackPressureError, DeploymentUnavailableError  # noqa: E402

from models import sleep_archive  # noqa: E402
from servetune._exceptions import ApiError  # noqa: E402
from servetune.api.types import InferRequest, InferResult, Input, ModelMetadata  # noqa: E402
from servetune.config.server import ServerConfig  # noqa: E402
from servetune.handlers.control import Control  # noqa: E402
from servetune.ray import ModelPlan, RayBackend, handles, plan_models, serve_config  # noqa: E402
from servetune.ray.frontend import FrontendView  # noqa: E402
from servetune.ray.replica import ModelReplica  # noqa: E402
from servetune.ray.serve_config import FrontendArgs, VersionArgs  # noqa: E402


class _Remote:
    def __init__(self, call: Callable[..., Any]) -> None:
        self.remote = call


class StandInHandle:
    """A deployment handle: answers as ``version``'s replicas would (the version on the answer), or raises
    ``error``; records what it was sent."""

    def __init__(self, version: str, error: Exception | None = None, partials: int = 0, final: bool = True) -> None:
        self.version, self.error, self.partials, self.final = version, error, partials, final
        self.sent: list[InferRequest] = []
        self.infer_remote = _Remote(self._infer)
        self.metadata_remote = _Remote(self._metadata)
        self.stream_remote = _Remote(self._stream)

    def options(self, **_: Any) -> StandInHandle:
        return self

    def _answer(self) -> InferResult:
        return InferResult(200, f"from {self.version}".encode(), "text/plain", version=self.version)

    async def _infer(self, request: InferRequest) -> InferResult:
        self.sent.append(request)
        if self.error is not None:
            raise self.error
        return self._answer()

    async def _metadata(self) -> ModelMetadata:
        if self.error is not None:
            raise self.error
        return ModelMetadata("m", ("1.0", "2.0"), f"platform of {self.version}")

    async def _stream(self, request: InferRequest) -> AsyncIterator[tuple[bool, InferResult]]:
        self.sent.append(request)
        for i in range(self.partials):
            yield False, InferResult(200, f"partial {i}".encode(), None)
        if self.error is not None:
            raise self.error
        if self.final:
            yield True, self._answer()


def _request(describe: bool = True) -> InferRequest:
    body = [Input("body", "text/plain", b"hello")]
    return InferRequest("r1", {}, body, time.monotonic(), lambda: False, Control(describe=describe))


@pytest.fixture(scope="module")
def two_versions(tmp_path_factory: pytest.TempPathFactory) -> ModelPlan:
    store = tmp_path_factory.mktemp("store")
    sleep_archive(store, name="m", version="1.0")
    (store / "m.mar").rename(store / "m1.mar")
    sleep_archive(store, name="m", version="2.0")
    [model] = plan_models(ServerConfig.from_properties({"model_store": str(store)}), ("m1.mar", "m.mar"))
    return model


@pytest.fixture
def handled(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Every handle the driver and the frontend look up (by version) answers as that version's replicas."""
    looked_up: list[str] = []

    def version_handle(model: str, version: str) -> StandInHandle:
        looked_up.append(f"{model}/{version}")
        return StandInHandle(version)

    monkeypatch.setattr(handles, "version_handle", version_handle)
    yield looked_up


def _views(model: ModelPlan) -> dict[str, Any]:
    """The three places a version is resolved, each built as it is on a cluster: the driver from its plans, the
    frontend and the ingress replica (the default version's, at the model's route) from the Serve config's args and
    user_config."""
    driver = RayBackend(ServerConfig())
    driver.plans = {model.name: model}
    config = serve_config([model])
    views: dict[str, Any] = {
        "driver": driver,
        "frontend": FrontendView(FrontendArgs.of_application(config["applications"][0]).models),
    }
    if model.serving:  # else the model has no application, so no replica
        [ingress] = [app for app in config["applications"] if app["route_prefix"] == f"/predictions/{model.name}"]
        args = VersionArgs.from_json(ingress["args"])
        replica = ModelReplica(args.plan, args.server)
        replica.reconfigure(ingress["deployments"][0]["user_config"])  # as Ray does before the replica serves
        views["replica"] = replica.view
    return views


def _scaled(model: ModelPlan, default: str, idle: tuple[str, ...]) -> ModelPlan:
    versions = {v: rv.scaled(0, 0) if v in idle else rv for v, rv in model.versions.items()}
    return ModelPlan(model.name, versions, default)


async def _outcome(view: Any, version: str | None) -> str:
    """The status of the ApiError raised, or the version that answered and who: ``handle`` (the stand-in) or
    ``handler`` (the replica's own handler, in this process)."""
    try:
        result: InferResult = await view.infer("m", version, _request())
    except ApiError as exc:
        return str(exc.status)
    assert result.status == 200, result.body
    return f"{result.version} by {'handle' if result.body.startswith(b'from ') else 'handler'}"


@pytest.mark.parametrize(
    ("default", "idle", "asked", "expected"),
    [
        ("1.0", (), None, "1.0"),
        ("1.0", (), "1.0", "1.0"),
        ("1.0", (), "2.0", "2.0"),
        ("1.0", (), "3.0", "404"),
        ("2.0", (), None, "2.0"),
        ("2.0", (), "1.0", "1.0"),
        ("1.0", ("2.0",), None, "1.0"),
        ("1.0", ("2.0",), "2.0", "503"),  # registered, no workers: TorchServe's 503
        ("1.0", ("2.0",), "3.0", "404"),
        ("1.0", ("1.0",), None, "503"),
        ("1.0", ("1.0",), "2.0", "2.0"),  # versions are independent (TorchServe): 2.0 answers, through the frontend
        ("1.0", ("1.0",), "3.0", "404"),
    ],
)
def test_the_driver_the_frontend_and_the_replica_mean_the_same_version(
    two_versions: ModelPlan, handled: list[str], default: str, idle: tuple[str, ...], asked: str | None, expected: str
) -> None:
    views = _views(_scaled(two_versions, default, idle))
    outcomes = {where: asyncio.run(_outcome(view, asked)) for where, view in views.items()}
    if expected in ("404", "503"):
        assert outcomes == dict.fromkeys(views, expected)
        assert handled == []
        return
    # the driver and the frontend reach every version through its handle; the ingress replica (the default
    # version's) runs its own version's request on its handler, and another version's through that one's handle
    wanted = {"driver": f"{expected} by handle", "frontend": f"{expected} by handle"}
    if "replica" in views:
        wanted["replica"] = f"{expected} by {'handler' if expected == default else 'handle'}"
    assert outcomes == wanted
    assert handled == [f"m/{expected}"] * (3 if "replica" in views and expected != default else 2)


def test_an_unknown_model_is_404_and_the_versions_listed_agree(two_versions: ModelPlan, handled: list[str]) -> None:
    views = _views(_scaled(two_versions, "1.0", ("2.0",)))
    for where, view in views.items():
        with pytest.raises(ApiError, match="Model not found: x") as caught:
            asyncio.run(view.infer("x", None, _request()))
        assert caught.value.status == 404, where
    listed = {where: {(r.name, r.version, r.is_default) for r in view.models()} for where, view in views.items()}
    assert listed == dict.fromkeys(views, {("m", "1.0", True), ("m", "2.0", False)})


def test_a_version_without_replicas_has_metadata_without_tensors(two_versions: ModelPlan, handled: list[str]) -> None:
    views = _views(_scaled(two_versions, "1.0", ("2.0",)))
    for where in ("frontend", "replica"):
        found = asyncio.run(views[where].metadata("m", "2.0"))
        assert found == ModelMetadata("m", ("1.0", "2.0"), ""), where
    assert handled == []  # nobody asked: no replica holds that version


def test_the_replica_reaches_another_version_through_its_handle(
    two_versions: ModelPlan, monkeypatch: pytest.MonkeyPatch
) -> None:
    other = StandInHandle("2.0")
    monkeypatch.setattr(
        handles, "version_handle", lambda model, version: other if (model, version) == ("m", "2.0") else None
    )
    views = _views(two_versions)
    replica = views["replica"]
    found = asyncio.run(replica.metadata("m", "2.0"))
    assert found.platform == "platform of 2.0"
    asked = _request()
    assert asyncio.run(replica.infer("m", "2.0", asked)).version == "2.0"
    [sent] = other.sent
    # what lives only in this process stays here; the rest travels unchanged
    assert sent.is_disconnected is None and asked.is_disconnected is not None
    assert dataclasses.replace(sent, is_disconnected=asked.is_disconnected) == asked


def test_a_version_deployed_again_is_reached_through_a_new_handle(
    two_versions: ModelPlan, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Handles are made once per version (Ray's lookup asks its controller) and forgotten once the version is no
    longer deployed: scaled to 0 and back, it is a new deployment to Ray."""
    made: list[str] = []

    def get_deployment_handle(name: str, app_name: str) -> StandInHandle:
        made.append(app_name)
        return StandInHandle(name)

    monkeypatch.setattr(handles.serve, "get_deployment_handle", get_deployment_handle)
    monkeypatch.setattr(handles, "_handles", {})
    first = handles.version_handle("m", "2.0")
    assert handles.version_handle("m", "2.0") is first
    handles.keep_deployed([two_versions.served])
    assert handles.version_handle("m", "2.0") is first
    handles.keep_deployed([_scaled(two_versions, "1.0", ("2.0",)).served])
    again = handles.version_handle("m", "2.0")
    assert again is not first and made == ["m_v2_0", "m_v2_0"]


@pytest.mark.parametrize(
    ("error", "message"),
    [
        (RayActorError(), "Worker died while running this request"),
        (DeploymentUnavailableError("m_v2_0"), "Worker died while running this request"),
        (BackPressureError(num_queued_requests=3, max_queued_requests=2), "queue is full; retry later"),
    ],
)
def test_a_ray_failure_through_a_handle_is_a_503_with_retry_after(error: Exception, message: str) -> None:
    for call in (
        lambda h: handles.infer(h, _request()),
        lambda h: handles.infer(h, dataclasses.replace(_request(), on_partial=lambda _: None)),  # a stream
    ):
        with pytest.raises(ApiError, match=message) as caught:
            asyncio.run(call(StandInHandle("2.0", error)))
        assert (caught.value.status, caught.value.headers) == (503, {"Retry-After": "1"})
    with pytest.raises(ApiError, match="while reading the model's metadata") as caught:
        asyncio.run(handles.metadata(StandInHandle("2.0", RayActorError())))
    assert caught.value.status == 503


def test_a_stream_through_a_handle_delivers_each_partial_then_the_final_answer() -> None:
    partials: list[bytes] = []
    streamed = dataclasses.replace(_request(describe=False), on_partial=lambda r: partials.append(r.body))
    handle = StandInHandle("1.0", partials=2)
    final = asyncio.run(handles.infer(handle, streamed))
    assert (partials, final.body) == ([b"partial 0", b"partial 1"], b"from 1.0")
    assert handle.sent[0].on_partial is None  # the callback stays in this process

    partials.clear()
    cut = StandInHandle("1.0", partials=1, final=False)
    with pytest.raises(ApiError, match="ended the stream without a final answer"):
        asyncio.run(handles.infer(cut, streamed))
    assert partials == [b"partial 0"]
