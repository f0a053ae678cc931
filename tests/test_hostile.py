"""The hostile-client suite (tests/hostile/cases_*.py: floods, bursts, idle and half-sent
streams, slow readers, oversized frames) in a loopback-only network namespace, in a pytest
of its own started here; bounded: each case by its own timeout, the run by their sum."""

from __future__ import annotations

import re

import pytest

from tests.netns import REPO, can_unshare, pytest_in_namespace

CASES = sorted((REPO / "tests" / "hostile").glob("cases_*.py"))
CASE_BUDGET_S = 180
RUN_BUDGET_S = CASE_BUDGET_S * sum(
    len(re.findall(r"^def test_", case.read_text(), re.M)) for case in CASES
)
WHY_NOT = can_unshare()


@pytest.mark.long(35)
@pytest.mark.skipif(WHY_NOT is not None, reason=WHY_NOT or "")
@pytest.mark.timeout(RUN_BUDGET_S + 60)  # (the run's own bound comes first)
def test_the_hostile_cases_pass_in_a_loopback_only_network():
    done = pytest_in_namespace(
        f"-o python_files=cases_*.py -o timeout={CASE_BUDGET_S} tests/hostile/", RUN_BUDGET_S
    )
    assert done.returncode == 0, done.stdout[-8000:] + done.stderr[-3000:]
    passed = re.search(r"(\d+) passed", done.stdout)
    assert passed and int(passed.group(1)) == RUN_BUDGET_S // CASE_BUDGET_S, done.stdout[-2000:]
    assert " skipped" not in done.stdout, done.stdout[-2000:]
