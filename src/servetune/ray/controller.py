"""The driver's view of the Ray cluster: connect, deploy a Serve config, wait, describe replicas.

Deploying goes through the same controller call as ``serve run config.yaml`` (a declarative config, so a change of
``num_replicas`` alone scales in place rather than replacing replicas). The Ray calls that are not public API are
kept in this module only: ``serve_start``/``deploy_apps`` and the GCS actor table for replica pids (the public
state API needs the dashboard, which small clusters run without).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass
from typing import Any

import psutil

from servetune._exceptions import WorkerLoadError
from servetune.embedded import RAY_NUM_CPUS_ENV
from servetune.ray._require import require_ray
from servetune.ray.plan import deployment_name

log = logging.getLogger("servetune.ray")

POLL_S = 0.25
# Ray Serve kills a proxy that is not ready within 5 s of its start (then starts another with a longer wait); on a
# busy 2-core host a first proxy took longer, and Serve's start failed on its death. A new local instance waits
# this long instead, and a proxy's death during the start is waited out (``PROXY_READY_S``) rather than fatal.
PROXY_READY_CHECK_ENV, PROXY_READY_CHECK_S = "RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S", "30"
PROXY_READY_S = 180.0
# CPUs a private local instance (``--ray-address local``) advertises; default: this machine's
LOCAL_CPUS_ENV = RAY_NUM_CPUS_ENV


@dataclass(frozen=True)
class ReplicaInfo:
    """One live replica process of a deployment."""

    actor_id: str
    pid: int
    node_id: str
    state: str
    start_time: float
    memory_bytes: int = 0  # resident memory, when the replica runs on the driver's machine (0: unknown)


class RayCluster:
    """The driver's connection to a Ray cluster, with Ray Serve's proxy at ``host:port``."""

    def __init__(self, *, host: str, port: int, proxy_location: str, address: str | None = None) -> None:
        self.host = host
        self.port = port
        self.proxy_location = proxy_location
        self.address = address
        self._client: Any = None

    # ---- lifecycle ---------------------------------------------------------------------------

    def connect(self) -> None:
        """Join the cluster at ``address`` (``auto``, ``host:port``, ``ray://...``; None: RAY_ADDRESS or a new
        local one) and start Serve's controller and proxy with our HTTP options. A local cluster started here gets
        servetune's proxy middleware (Ray's plain-text errors answered as TorchServe's JSON); an existing cluster
        needs ``RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH`` set where it was started (docs/scale-out.md)."""
        ray = require_ray()
        from ray.serve._private.api import serve_start

        from servetune.ray.proxy_errors import PROXY_CALLBACK_ENV, PROXY_CALLBACK_PATH

        if not ray.is_initialized():
            os.environ.setdefault(PROXY_CALLBACK_ENV, PROXY_CALLBACK_PATH)
            os.environ.setdefault(PROXY_READY_CHECK_ENV, PROXY_READY_CHECK_S)
            kwargs: dict[str, Any] = {"logging_level": logging.WARNING, "log_to_driver": False}
            if self.address == "local":  # a new instance inside this process: small, no dashboard
                kwargs["include_dashboard"] = False
                if os.environ.get(LOCAL_CPUS_ENV):  # the tuner's: room for its widest config, as native runs it
                    kwargs["num_cpus"] = int(os.environ[LOCAL_CPUS_ENV])
            ray.init(address=self.address, **kwargs)
        http, location = {"host": self.host, "port": self.port}, self.proxy_location
        try:
            self._client = serve_start(http_options=http, proxy_location=location)
        except ray.exceptions.ActorDiedError as exc:
            if "ProxyActor" not in str(exc):
                raise
            # Serve's controller killed a proxy that was slow to start, and starts another: wait for it
            log.warning("Ray Serve's proxy was not ready in time and is being restarted; waiting for it")
            self._client = serve_start(http_options=http, proxy_location=location)  # returns at once: it runs
            self.wait_proxies(PROXY_READY_S)

    def wait_proxies(self, timeout_s: float) -> None:
        """Wait until every proxy Serve runs is healthy (and there is one); TimeoutError after ``timeout_s``."""
        from ray import serve

        deadline = time.monotonic() + timeout_s
        proxies: dict[str, Any] = {}
        while time.monotonic() < deadline:
            proxies = serve.status().proxies
            if proxies and all(state_name(status) == "HEALTHY" for status in proxies.values()):
                return
            time.sleep(POLL_S)
        states = ", ".join(state_name(status) for status in proxies.values()) or "none"
        raise TimeoutError(f"Ray Serve's proxies were not ready after {timeout_s:g} s (their states: {states})")

    def deploy(self, config: dict[str, Any]) -> None:
        """Apply a whole Serve config: applications not in it are deleted, unchanged ones are left alone."""
        from ray.serve.schema import ServeDeploySchema

        self._client.deploy_apps(ServeDeploySchema.model_validate(config))

    def wait_deployed(self, names: list[str], timeout_s: float) -> dict[str, str | None]:
        """Wait until every named application runs or fails; name -> None (running) or the failure."""
        from ray import serve

        deadline = time.monotonic() + timeout_s
        while True:
            status = serve.status()
            outcome: dict[str, str | None] = {}
            for name in names:
                app = status.applications.get(name)
                state = state_name(app.status) if app is not None else "NOT_STARTED"
                if state == "RUNNING":
                    outcome[name] = None
                elif state in ("DEPLOY_FAILED", "UNHEALTHY") and app is not None:
                    outcome[name] = _failure(app)
            if len(outcome) == len(names):
                return outcome
            if time.monotonic() > deadline:
                for name in names:
                    outcome.setdefault(name, f"not running after {timeout_s:g} s")
                return outcome
            time.sleep(POLL_S)

    def wait_running(self, app_name: str, timeout_s: float) -> bool:
        """Wait until an application has applied its latest config (the controller marks it DEPLOYING as it accepts
        one, RUNNING once every deployment runs it)."""
        from ray import serve

        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            app = serve.status().applications.get(app_name)
            if app is not None and state_name(app.status) == "RUNNING":
                return True
            time.sleep(POLL_S)
        return False

    def shutdown(self, timeout_s: float = 15.0) -> None:
        """Delete every Serve application, the controller and the proxies, then leave the cluster. Bounded: when
        the cluster is going down too (Ctrl-C reaches a local instance's processes as well), give up waiting."""
        ray = require_ray()
        from ray import serve

        if not ray.is_initialized():
            return
        stopper = threading.Thread(target=serve.shutdown, name="serve-shutdown", daemon=True)
        stopper.start()
        stopper.join(timeout_s)
        if stopper.is_alive():
            log.warning("Ray Serve did not shut down within %g s; leaving the cluster anyway", timeout_s)
        ray.shutdown()

    # ---- replicas ----------------------------------------------------------------------------

    def wait_replicas(self, name: str, version: str, count: int | None, timeout_s: float) -> bool:
        """Wait until the version's application is no longer deploying (every change applied: the controller marks it
        DEPLOYING as it accepts a config) and its deployment is healthy with exactly ``count`` running replicas (None:
        any number), none starting, stopping or being reconfigured; for 0, until the application is gone. False when
        ``timeout_s`` passed first; WorkerLoadError when the application failed to deploy (its replicas could not
        load the model)."""
        from ray import serve

        deployment = deployment_name(name, version)
        deadline = time.monotonic() + timeout_s
        while True:
            app = serve.status().applications.get(deployment)
            if app is not None and state_name(app.status) == "DEPLOY_FAILED":
                raise WorkerLoadError(_failure(app))
            if app is None and count == 0:
                return True
            found = app.deployments.get(deployment) if app is not None else None
            if app is not None and found is not None and state_name(app.status) != "DEPLOYING":
                states = {state_name(k): v for k, v in found.replica_states.items()}
                others = sum(v for k, v in states.items() if k != "RUNNING")
                running = states.get("RUNNING", 0)
                if (running == count or (count is None and running > 0)) and not others:
                    if state_name(found.status) == "HEALTHY":
                        return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(POLL_S)

    def replicas(self, name: str, version: str) -> list[ReplicaInfo]:
        """Live replica processes of a version, oldest first (from the GCS actor table)."""
        ray = require_ray()
        from ray._private import state

        deployment = deployment_name(name, version)  # its application's name too
        class_name = f"ServeReplica:{deployment}:{deployment}"
        table: dict[str, dict[str, Any]] = state.actors(actor_state_name="ALIVE")
        here = ray.util.get_node_ip_address()
        found = [
            ReplicaInfo(
                actor_id=actor_id,
                pid=int(info.get("Pid") or -1),
                node_id=str((info.get("Address") or {}).get("NodeID", "")),
                state=str(info.get("State")),
                start_time=float(info.get("StartTime") or 0) / 1000.0,
                memory_bytes=_rss(int(info.get("Pid") or -1)) if (info.get("Address") or {}).get("IPAddress") == here
                else 0,
            )
            for actor_id, info in table.items()
            if info.get("ActorClassName") == class_name
        ]  # fmt: skip
        return sorted(found, key=lambda r: r.start_time)

    def deployment_status(self, name: str, version: str) -> dict[str, Any]:
        from ray import serve

        deployment = deployment_name(name, version)  # its application's name too
        app = serve.status().applications.get(deployment)
        found = app.deployments.get(deployment) if app is not None else None
        if found is None:
            return {"status": "NOT_DEPLOYED", "replicaStates": {}}
        states = {state_name(k): int(v) for k, v in found.replica_states.items()}
        return {"status": state_name(found.status), "message": found.message, "replicaStates": states}


def _rss(pid: int) -> int:
    try:
        return int(psutil.Process(pid).memory_info().rss)
    except (psutil.Error, ValueError):
        return 0


def state_name(value: Any) -> str:
    """``RUNNING`` for Ray's status enums (``str(ApplicationStatus.RUNNING)`` spells the class too)."""
    return str(getattr(value, "value", value))


def _failure(app: Any) -> str:
    messages = [str(app.message)] if getattr(app, "message", "") else []
    for name, deployment in app.deployments.items():
        if getattr(deployment, "message", ""):
            messages.append(f"{name}: {without_traceback(str(deployment.message))}")
    return "; ".join(messages) or state_name(app.status)


def without_traceback(message: str) -> str:
    """A replica's failure as Ray words it, less the tracebacks it quotes: Ray's own first line and the exception's
    last (``servetune._exceptions.ConfigError: controller.slo.p99_ms=100 is below ...``)."""
    if "Traceback (most recent call last)" not in message:
        return message
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    return f"{lines[0]} {lines[-1]}"


__all__ = ["RayCluster", "ReplicaInfo", "state_name", "without_traceback"]
