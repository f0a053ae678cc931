"""What the kit found: one `Check` per thing it verified, and the report a person (a line
per check, the failed request and its answer in full) or a CI system (JUnit XML) reads."""

from __future__ import annotations

import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from mistk_rl.files import atomic_write_bytes


@dataclass(frozen=True)
class Exchange:
    """One request and what came back, as text a person can read and replay."""

    method: str
    url: str
    status: int  # 0: no answer (refused, timed out)
    content_type: str = ""
    request_body: str = ""
    response_body: str = ""
    error: str = ""  # why there was no answer

    def describe(self) -> str:
        lines = [f"{self.method} {self.url}"]
        if self.request_body:
            lines.append(f"  body: {_short(self.request_body)}")
        if self.status:
            lines.append(f"  -> {self.status} {self.content_type}".rstrip())
            if self.response_body:
                lines.append(f"     {_short(self.response_body)}")
        else:
            lines.append(f"  -> no answer: {self.error}")
        return "\n".join(lines)


def _short(text: str, limit: int = 600) -> str:
    return text if len(text) <= limit else text[:limit] + f"... ({len(text)} characters)"


@dataclass(frozen=True)
class Check:
    """One verdict. `name` is stable (``agent.ready.episodeStopped.refused``) so a CI system
    follows a check across runs; `group` is what the report files it under."""

    name: str
    passed: bool
    detail: str = ""  # what was expected and what was seen, when it failed
    exchange: Optional[Exchange] = None
    seconds: float = 0.0

    @property
    def group(self) -> str:
        return self.name.rsplit(".", 1)[0]


@dataclass
class Report:
    """The checks in the order they ran, for one service."""

    role: str
    url: str
    checks: list[Check] = field(default_factory=list)
    started: float = field(default_factory=time.perf_counter)
    aborted: str = ""  # why the run stopped early (the service stopped answering, ...)

    def add(self, check: Check) -> Check:
        self.checks.append(check)
        return check

    @property
    def failed(self) -> list[Check]:
        return [c for c in self.checks if not c.passed]

    @property
    def passed(self) -> bool:
        return bool(self.checks) and not self.failed and not self.aborted

    def seconds(self) -> float:
        return time.perf_counter() - self.started

    def names(self, passed: Optional[bool] = None) -> list[str]:
        return [c.name for c in self.checks if passed is None or c.passed == passed]

    def text(self, verbose: bool = False) -> str:
        """The report: failures in full (the request that failed and what came back), then
        a line per check when `verbose`, then the totals."""
        out = [f"conformance of the {self.role} at {self.url}"]
        for check in self.checks:
            if verbose or not check.passed:
                out.append(f"{'PASS' if check.passed else 'FAIL'}  {check.name}")
            if not check.passed:
                if check.detail:
                    out.append("      " + check.detail.replace("\n", "\n      "))
                if check.exchange is not None:
                    out.append("      " + check.exchange.describe().replace("\n", "\n      "))
        if self.aborted:
            out.append(f"ABORTED  {self.aborted}")
        out.append(
            f"{len(self.checks) - len(self.failed)} of {len(self.checks)} checks passed, "
            f"{len(self.failed)} failed, in {self.seconds():.1f} s"
        )
        return "\n".join(out)

    def junit(self) -> str:
        """JUnit XML: a testsuite for the service, a testcase per check (classname: its
        group), a <failure> with the detail and the exchange for each failed one."""
        suite = ET.Element(
            "testsuite",
            name=f"mistk-rl conformance: {self.role}",
            tests=str(len(self.checks) + bool(self.aborted)),
            failures=str(len(self.failed) + bool(self.aborted)),
            errors="0",
            time=f"{self.seconds():.3f}",
        )
        ET.SubElement(ET.SubElement(suite, "properties"), "property", name="url", value=self.url)
        for check in self.checks:
            case = ET.SubElement(
                suite,
                "testcase",
                classname=check.group,
                name=check.name.rsplit(".", 1)[-1],
                time=f"{check.seconds:.3f}",
            )
            if not check.passed:
                failure = ET.SubElement(case, "failure", message=check.detail or check.name)
                failure.text = check.exchange.describe() if check.exchange else check.detail
        if self.aborted:
            case = ET.SubElement(suite, "testcase", classname=self.role, name="run")
            ET.SubElement(case, "failure", message=self.aborted)
        ET.indent(suite)
        return ET.tostring(suite, encoding="unicode", xml_declaration=True) + "\n"

    def write_junit(self, path: Path) -> None:
        atomic_write_bytes(Path(path), self.junit().encode())
