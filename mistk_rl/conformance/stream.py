"""The step stream (capability ``stream``): without the upgrade the path answers 426 naming
the protocol; upgraded, a stepColumns body sent as a frame gets its answer as a frame."""

from __future__ import annotations

import numpy as np

from mistk_rl.conformance.host import AgentHost
from mistk_rl.conformance.values import in_space
from mistk_rl.sdk.client import AgentClient, ServiceError


def check_step_stream(suite: AgentHost) -> None:
    suite.expect("stream.no-upgrade.426", "stepStream", [426])
    if suite.state() != "ready" or suite.start_episode(prefix="stream").status != 200:
        return
    client = AgentClient(suite.probe.base_url, token=suite.token, timeout=suite.probe.timeout)
    pipeline = client.step_stream()
    obs = np.asarray(suite.first_obs)[None]
    try:
        pipeline.send(np.array([0]), obs)
        upgraded = pipeline.upgraded
        answer = pipeline.receive()
        ok = len(answer.actions) == 1 and in_space(suite.act_space, answer.actions[0])
        detail = f"answered {answer.actions!r}"
    except ServiceError as exc:
        upgraded, ok, detail = False, False, f"{type(exc).__name__}: {exc}"
    finally:
        pipeline.close()
        client.close()
    suite.check("stream.upgrades", upgraded, "the upgrade to mistk-steps was refused")
    suite.check("stream.frame-answered", ok, detail)
    suite.expect("stream.episodeStopped", "episodeStopped", [200])
    suite.settle("stream.ready-again", "ready")
