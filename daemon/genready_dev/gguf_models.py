"""Tiny GGUF models the real-server tests make themselves (no weights are ever downloaded).

A llama-architecture model with a 259-token byte vocabulary (<unk>, <s>, </s> and the 256 byte
tokens <0x00>..<0xFF>, SentencePiece "llama" tokenizer with byte fallback): 2 layers, n_embd 64,
~460 KB, loads in tens of ms. Plain small random weights make greedy output one token forever,
so the token embeddings are scaled ~50x and the output layer ~20x: the next token then depends on
the input, and a draft's acceptance means something. The output rows of every token that is not
printable ASCII (the specials, control bytes, bytes >= 0x80) are zero: greedy decoding never picks
them, so generation never ends early (no EOS) and the text is always valid UTF-8.

Drafts share the vocabulary: `draft-copy` is a byte copy of `tiny`, `draft-noisy-*` add seeded
noise to its weights, `draft-other` has other random weights. `big` is the same recipe at a few
hundred MB, to see llama-server's loading window.

Everything is seeded, so a model's bytes depend only on its `Spec` (and the pinned gguf/numpy of
the tool venv): files are cached under `<cache>/models/NAME-KEY.gguf`, KEY hashing the spec and
FORMAT (bump FORMAT when the writer changes what it writes).

`ensure(*names)` runs in any interpreter (the test runs on the .venv, Python 3.10/3.13, Debian's
python3): numpy and gguf are imported only by `write`, which runs in the gguf tool venv that
`genready_dev.realservers` keeps in the cache (`python -m genready_dev.gguf_models make NAME...`).
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

FORMAT = 1
VOCAB = 259  # <unk> <s> </s> + 256 byte tokens
PRINTABLE = range(0x20, 0x7F)  # the only bytes the output layer may pick


@dataclass(frozen=True)
class Spec:
    seed: int
    n_embd: int = 64
    n_layer: int = 2
    n_ff: int = 128
    n_head: int = 4
    n_ctx: int = 2048
    embd_scale: float = 50.0
    output_scale: float = 20.0
    # A draft made from another model's weights plus noise: the base model's name, the noise's
    # standard deviation relative to each tensor's own, and the noise's seed (`seed` above).
    noisy_copy_of: str = ""
    noise: float = 0.0


MODELS: dict[str, Spec] = {
    "tiny": Spec(seed=1),
    "draft-copy": Spec(seed=1),  # the same spec: the same bytes as "tiny"
    "draft-noisy-lo": Spec(seed=101, noisy_copy_of="tiny", noise=0.3),
    "draft-noisy-hi": Spec(seed=102, noisy_copy_of="tiny", noise=1.0),
    "draft-other": Spec(seed=2),
    "tiny-b": Spec(seed=3),  # a second model (router mode lists several)
    "big": Spec(seed=4, n_embd=512, n_layer=24, n_ff=1536, n_head=8),  # ~330 MB
}


def key(name: str) -> str:
    spec = MODELS[name]
    text = json.dumps({"format": FORMAT, "spec": dataclasses.asdict(spec),
                       "base": dataclasses.asdict(MODELS[spec.noisy_copy_of]) if spec.noisy_copy_of else None},
                      sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def models_dir(cache: Path | None = None) -> Path:
    from genready_dev.realservers import cache_dir

    return (cache or cache_dir()) / "models"


def path(name: str, cache: Path | None = None) -> Path:
    """Where model NAME is cached (it may not exist yet: `ensure` makes it)."""
    return models_dir(cache) / f"{name}-{key(name)}.gguf"


def ensure(*names: str, cache: Path | None = None) -> dict[str, Path]:
    """{name: path} of the named models, making the missing ones with the gguf tool venv."""
    from genready_dev.realservers import ensure_gguf_tools

    paths = {n: path(n, cache) for n in names}
    missing = [n for n, p in paths.items() if not p.exists()]
    if missing:
        python = ensure_gguf_tools()
        daemon_dir = str(Path(__file__).resolve().parents[1])
        env = {**os.environ, "PYTHONPATH": daemon_dir}
        subprocess.run([str(python), "-m", "genready_dev.gguf_models", "make", "--dir", str(models_dir(cache)),
                        *missing], check=True, env=env, timeout=600)
    return paths


# --- the writer (runs where numpy and gguf are installed) --------------------------------------

def _weights(spec: Spec) -> dict[str, Any]:
    import numpy as np

    rng = np.random.default_rng(spec.seed)
    e, ff = spec.n_embd, spec.n_ff

    def normal(*shape: int, scale: float = 1.0) -> Any:
        return (rng.standard_normal(shape, dtype=np.float32) * np.float32(0.02 * scale)).astype(np.float32)

    # numpy shapes are (rows, cols) = (out, in); gguf stores them reversed, as llama.cpp expects.
    t: dict[str, Any] = {"token_embd.weight": normal(VOCAB, e, scale=spec.embd_scale)}
    for i in range(spec.n_layer):
        t[f"blk.{i}.attn_norm.weight"] = np.ones(e, dtype=np.float32)
        for n in ("q", "k", "v", "output"):
            t[f"blk.{i}.attn_{n}.weight"] = normal(e, e)
        t[f"blk.{i}.ffn_norm.weight"] = np.ones(e, dtype=np.float32)
        t[f"blk.{i}.ffn_gate.weight"] = normal(ff, e)
        t[f"blk.{i}.ffn_up.weight"] = normal(ff, e)
        t[f"blk.{i}.ffn_down.weight"] = normal(e, ff)
    t["output_norm.weight"] = np.ones(e, dtype=np.float32)
    output = normal(VOCAB, e, scale=spec.output_scale)
    keep = np.zeros(VOCAB, dtype=bool)
    keep[[3 + b for b in PRINTABLE]] = True
    output[~keep] = 0.0
    t["output.weight"] = output
    return t


def _noisy(base: dict[str, Any], spec: Spec) -> dict[str, Any]:
    import numpy as np

    rng = np.random.default_rng(spec.seed)
    out = {}
    for name, w in base.items():
        if name.endswith("norm.weight"):
            out[name] = w
            continue
        noisy = w + rng.standard_normal(w.shape, dtype=np.float32) * np.float32(spec.noise) * w.std()
        if name == "output.weight":
            noisy[w == 0] = 0.0  # keep the printable-only output
        out[name] = noisy.astype(np.float32)
    return out


def write(name: str, dest: Path) -> None:
    import gguf

    spec = MODELS[name]
    if spec.noisy_copy_of:
        base = MODELS[spec.noisy_copy_of]
        tensors = _noisy(_weights(base), spec)
        dims = base
    else:
        tensors, dims = _weights(spec), spec
    tmp = dest.with_name(f".{dest.name}.{os.getpid()}.tmp")
    w = gguf.GGUFWriter(str(tmp), "llama")
    w.add_context_length(dims.n_ctx)
    w.add_embedding_length(dims.n_embd)
    w.add_block_count(dims.n_layer)
    w.add_feed_forward_length(dims.n_ff)
    w.add_head_count(dims.n_head)
    w.add_head_count_kv(dims.n_head)
    w.add_rope_dimension_count(dims.n_embd // dims.n_head)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_tokenizer_model("llama")
    w.add_token_list(["<unk>", "<s>", "</s>", *(f"<0x{b:02X}>" for b in range(256))])
    w.add_token_scores([0.0] * VOCAB)
    w.add_token_types([gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL,
                       *([gguf.TokenType.BYTE] * 256)])
    w.add_unk_token_id(0)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_add_bos_token(True)
    w.add_add_space_prefix(False)
    for tname, arr in tensors.items():
        w.add_tensor(tname, arr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    os.replace(tmp, dest)  # atomic: a concurrent maker or reader never sees half a model


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m genready_dev.gguf_models", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    make = sub.add_parser("make", help="write the named models into DIR (as NAME-KEY.gguf)")
    make.add_argument("--dir", type=Path, required=True)
    make.add_argument("names", nargs="+", choices=sorted(MODELS))
    args = p.parse_args(argv)
    args.dir.mkdir(parents=True, exist_ok=True)
    for name in args.names:
        dest = args.dir / f"{name}-{key(name)}.gguf"
        if not dest.exists():
            write(name, dest)
        print(dest)
    return 0


if __name__ == "__main__":
    sys.exit(main())
