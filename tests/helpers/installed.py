"""Tools some tests need that CI installs (scripts/test.sh): sshd, chromium, systemd-analyze, the arm64 chroot.

Where one is missing, its tests skip on a developer's machine. Under CI
(``CI=true``, as .ci/run runs) they fail instead: CI installs every one of
these, so a skip there would hide a broken install step behind a green run.
"""
import os
import shutil
from typing import Optional

import pytest


def under_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def require(missing: Optional[str]) -> None:
    """Skip the test (fail it under CI) when ``missing`` says why a needed tool is not here; None: it is."""
    if missing is None:
        return
    if under_ci():
        pytest.fail(f"{missing}; under CI=true that is a failure, not a skip: CI installs it",
                    pytrace=False)
    pytest.skip(missing)


def chromium() -> str:
    """The headless browser's executable (Debian's chromium)."""
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    require(None if exe else "Debian's chromium is not installed (scripts/test.sh installs it as root)")
    return exe
