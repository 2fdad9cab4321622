"""Build the default job's warm-up on this machine and ship it in the package.

    python scripts/ship_start.py                       # the default config, seed 0 -> starts/default-seed0
    python scripts/ship_start.py --cache outputs/cache # reuse a warm-up already built there

The warm-up is built with `model.warmup.shipped=false` (or taken from the cache, where the same
recipe was built before), its files are copied to src/grpo_aug/models/starts/<name>/ and the
manifest records the recipe it answers to and the SHA-256 of its weights. Every default job then
loads these weights instead of building its own (models/shipped.py). Rebuilding on another
machine gives other weights: commit them only with the README's start figures measured again.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

from hydra import compose, initialize_config_dir
from hydra.utils import instantiate

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from grpo_aug.models.shipped import MANIFEST, RECIPE, STARTS, WEIGHTS, file_sha256  # noqa: E402
from grpo_aug.pipeline import check_tools, prepare_model, prompt_datamodule  # noqa: E402

# what from_pretrained needs; the recipe stays beside it as provenance
FILES = ["config.json", "generation_config.json", WEIGHTS, "tokenizer.json", "tokenizer_config.json", RECIPE]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--name", default="default-seed0")
    parser.add_argument("--cache", type=Path, default=ROOT / "outputs" / "cache")
    parser.add_argument("overrides", nargs="*", help="config overrides of the job whose start is shipped")
    args = parser.parse_args()
    overrides = [f"paths.root_dir={ROOT}", f"paths.cache_dir={args.cache.resolve()}", "model.warmup.shipped=false",
                 *args.overrides]
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose(config_name="train", overrides=overrides)
    model = instantiate(cfg.model)
    datamodule = prompt_datamodule(cfg)
    datamodule.setup("fit")
    built = Path(prepare_model(model, datamodule.train_records, cfg.paths.cache_dir, cfg.seed, check_tools(cfg)))
    recipe = json.loads((built / RECIPE).read_text())
    out = STARTS / args.name
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    for name in FILES:
        shutil.copy2(built / name, out / name)
    sha = file_sha256(out / WEIGHTS)
    entries = json.loads(MANIFEST.read_text()) if MANIFEST.is_file() else {}
    entries[args.name] = {"recipe_key": recipe["recipe_key"], "sha256": sha, "recipe": recipe["recipe"],
                          "overrides": args.overrides, "built_from": str(built.name),
                          "rebuild": "python scripts/ship_start.py " + " ".join(args.overrides)}
    MANIFEST.write_text(json.dumps(entries, indent=1) + "\n")
    print(f"{out}: {WEIGHTS} sha256 {sha}, recipe {recipe['recipe_key']}")


if __name__ == "__main__":
    main()
