"""What systemd makes of a drop-in before it is written: `systemd-analyze verify` on a copy of the unit.

systemd forgives a unit file silently where a sweep needs it strict: an unknown key
(`Enviroment=`), a bad section header (`[Service`), an unknown specifier (`%Z`) or a broken
quote are logged and *ignored*, and the server starts on its base configuration, which the sweep
would then record as the point's. `systemd-analyze verify` runs systemd's own unit-file parser
(the one the manager uses) and prints those messages, each as `FILE:LINE: ...`.

The unit's fragment is copied into a temporary folder with the drop-in under `UNIT.d/`: verify
puts the folder of the unit file it is given first in the unit path, so the copy and its drop-in
win over the installed ones (a drop-in of the same name elsewhere, such as the previous point's,
is masked), while the unit's other drop-ins load as they would. A unit whose own files already
draw complaints is not the drop-in's fault: only lines that the drop-in adds are reported.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Final

from genready.store import bounded

VERIFY_TIMEOUT: Final = 30.0  # seconds; it takes ~40 ms here


class CannotVerify(Exception):
    """systemd-analyze is missing or failed to run, or the unit's fragment cannot be read; the message says which."""


class DropinCheck:
    """Checks drop-in texts for one unit; safe to call from several threads (each call has its own folder)."""

    def __init__(self, unit: str, fragment: str, dropin: Path, *, user: bool) -> None:
        if not fragment:
            raise CannotVerify(f"{unit} has no unit file of its own (FragmentPath is empty)")
        self.tool = shutil.which("systemd-analyze")
        if self.tool is None:
            raise CannotVerify("systemd-analyze is not installed")
        try:
            self.fragment_text = bounded.read_file(fragment, 1 << 20)  # the one bounded reader
        except bounded.FileError as e:
            raise CannotVerify(str(e)) from None
        except OSError as e:
            raise CannotVerify(f"cannot read {fragment}: {e.strerror}") from None
        self.unit, self.fragment, self.dropin, self.user = unit, fragment, dropin, user
        self._baseline = set(self._lines(None))  # what the unit's own files draw, without the drop-in

    def complaints(self, text: str) -> list[str]:
        """systemd's words about `text` as the drop-in: the lines verify prints with it and not without it
        (empty: systemd takes it as written)."""
        return [ln for ln in self._lines(text) if ln not in self._baseline]

    def _lines(self, text: str | None) -> Sequence[str]:
        with tempfile.TemporaryDirectory(prefix="genready-verify-") as tmp:
            unit_file = Path(tmp) / self.unit
            unit_file.write_bytes(self.fragment_text)
            dropin = Path(tmp) / f"{self.unit}.d" / self.dropin.name
            dropin.parent.mkdir()
            dropin.write_text(text or "")  # empty for the baseline: still masks a leftover of that name
            cmd = [str(self.tool), *(["--user"] if self.user else []), "verify", "--man=no", str(unit_file)]
            env = dict(os.environ, SYSTEMD_COLORS="0", SYSTEMD_LOG_COLOR="0", SYSTEMD_LOG_LOCATION="0",
                       SYSTEMD_LOG_TIME="0", SYSTEMD_LOG_TARGET="console")
            try:
                done = subprocess.run(cmd, capture_output=True, text=True, errors="replace", env=env, cwd=tmp,
                                      stdin=subprocess.DEVNULL, timeout=VERIFY_TIMEOUT)
            except (OSError, subprocess.TimeoutExpired) as e:
                raise CannotVerify(f"systemd-analyze verify did not run: {e}") from None
            # In systemd's words, with the real paths instead of the temporary copies.
            out = (done.stderr + done.stdout).replace(str(dropin), str(self.dropin))
            out = out.replace(str(unit_file), self.fragment)
            return [ln.strip() for ln in out.splitlines() if ln.strip()]
