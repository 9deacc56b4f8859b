"""Images through the engine: a job of `--rows` chat rows over `--images` distinct images
(each image asked `rows / images` different questions), greedy, `--max-tokens` new tokens,
on a LLaVA built from a config with random weights, real-shaped but small enough for a
2-core CPU: a CLIP tower (hidden 384, 6 layers, 224 px, patch 32: 49 image tokens) and a
Llama decoder (hidden 576, 8 layers, GQA 9:3, SmolLM2-135M's vocabulary size) with the test
tokenizer (tests/conftest.py; SmolLM2's own needs the hub).

    PYTHONPATH=$PWD python scripts/bench_images.py [--rows 1000] [--images 100]
        [--max-tokens 8] [--repeat 1] [--hf-batch 16]

Three systems on the same processor outputs (preprocessing is done once, before any timing,
and reported apart):
  cached   our engine, encoder cache and prefix cache on (the defaults);
  uncached our engine, `encoder_cache_memory=0` and `enable_prefix_cache=False`;
  hf       transformers `generate` in batches of `--hf-batch` rows (left padding).
Rows come in job order with the images interleaved (row i shows image i mod --images), so
a repeated image is rarely the row just before. Prints one JSON object: per system the
median wall over `--repeat`, images/s (image rows per second), rows/s, images_encoded and
cached tokens, and whether the engine's two runs gave the same tokens.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from vision_kit import image_message, random_image, save_llava

from astrai_batch.engine import (
    EngineConfig,
    GenerationRequest,
    SamplingParams,
    generate_sync,
)
from astrai_batch.engine.model.loader import load_model
from astrai_batch.engine.vision.image_inputs import image_prompt

IMAGE_SIZE = 224
PATCH = 32


def save_bench_llava(path: Path, seed: int = 0) -> Path:
    """The benchmark's LLaVA (see the module docstring) and its processor, saved to `path`."""
    vision = dict(
        hidden_size=384, intermediate_size=1536, num_hidden_layers=6, num_attention_heads=6
    )
    text = dict(
        vocab_size=49152,
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=8,
        num_attention_heads=9,
        num_key_value_heads=3,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        initializer_range=0.02,  # transformers' default, not the tiny tests' wide one
    )
    return save_llava(path, vision, text, IMAGE_SIZE, PATCH, seed)


def job_rows(rows: int, images: int) -> list[tuple[int, str]]:
    """(image index, question) per row: row i shows image i mod `images`, and no two rows
    of one image ask the same question."""
    if not 0 < images <= rows:
        raise ValueError(f"--images must be between 1 and --rows ({rows}), got {images}")
    return [(i % images, f"Question {i // images}: what is in this picture?") for i in range(rows)]


def prepare(processor, rows, pictures, image_token_id, max_tokens, lengths):
    """Each row's processor output (for transformers) and its engine request."""
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    prompts, requests = [], []
    for i, (image, question) in enumerate(rows):
        prompt = processor.apply_chat_template(image_message(question), add_generation_prompt=True)
        batch = processor(images=[pictures[image]], text=prompt, return_tensors="pt")
        ids, inputs = image_prompt(
            batch["input_ids"][0].tolist(), image_token_id, [batch["pixel_values"]], lengths
        )
        prompts.append(prompt)
        requests.append(GenerationRequest(i, ids, params, images=inputs))
    return prompts, requests


def run_engine(loaded, requests, config):
    start = time.perf_counter()
    results, stats = generate_sync(loaded, requests, config)
    wall = time.perf_counter() - start
    tokens = [list(r.token_ids) for r in results]
    return wall, tokens, stats


def run_hf(model_dir, processor, rows, prompts, pictures, max_tokens, batch_size):
    """transformers `generate`, `batch_size` rows a call, left padded; the processor runs
    before the clock starts."""
    from transformers import LlavaForConditionalGeneration

    model = LlavaForConditionalGeneration.from_pretrained(model_dir, dtype=torch.float32).eval()
    processor.tokenizer.padding_side = "left"
    batches = []
    for at in range(0, len(rows), batch_size):
        chunk = range(at, min(at + batch_size, len(rows)))
        batches.append(
            processor(
                images=[pictures[rows[i][0]] for i in chunk],
                text=[prompts[i] for i in chunk],
                return_tensors="pt",
                padding=True,
            )
        )
    start = time.perf_counter()
    with torch.inference_mode():
        for batch in batches:
            model.generate(
                **batch,
                max_new_tokens=max_tokens,
                min_new_tokens=max_tokens,
                do_sample=False,
                pad_token_id=model.config.text_config.pad_token_id,
            )
    return time.perf_counter() - start


def summary(walls, rows, stats=None):
    wall = statistics.median(walls)
    out = {
        "wall_s": round(wall, 3),
        "walls_s": [round(w, 3) for w in walls],
        "images_per_s": round(rows / wall, 2),
        "rows_per_s": round(rows / wall, 2),
    }
    if stats is not None:
        out |= {
            "images_encoded": stats.images_encoded,
            "image_encodes_saved": stats.image_encodes_saved,
            "image_tokens_cached": stats.image_tokens_cached,
            "cached_tokens": stats.cache.hit_tokens,
            "prefill_tokens": stats.prefill_tokens,
        }
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=1000)
    parser.add_argument("--images", type=int, default=100)
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--hf-batch", type=int, default=16)
    parser.add_argument("--skip-hf", action="store_true")
    args = parser.parse_args()
    rows = job_rows(args.rows, args.images)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = save_bench_llava(Path(tmp) / "llava")
        loaded = load_model(model_dir)
        tower = loaded.vision
        pictures = [random_image(1000 + i, (320, 240)) for i in range(args.images)]
        start = time.perf_counter()
        prompts, requests = prepare(
            tower.processor,
            rows,
            pictures,
            tower.image_token_id,
            args.max_tokens,
            [tower.tokens_per_image],
        )
        preprocess = time.perf_counter() - start
        configs = {
            "cached": EngineConfig(),
            "uncached": EngineConfig(enable_prefix_cache=False, encoder_cache_memory=0),
        }
        run_engine(loaded, requests[:2], EngineConfig())  # warm-up, untimed
        walls = {name: [] for name in configs} | {"hf": []}
        last = {}
        for _ in range(args.repeat):
            for name, config in configs.items():
                wall, tokens, stats = run_engine(loaded, requests, config)
                walls[name].append(wall)
                last[name] = (tokens, stats)
            if not args.skip_hf:
                walls["hf"].append(
                    run_hf(
                        model_dir,
                        tower.processor,
                        rows,
                        prompts,
                        pictures,
                        args.max_tokens,
                        args.hf_batch,
                    )
                )
    report = {
        "rows": args.rows,
        "images": args.images,
        "max_tokens": args.max_tokens,
        "repeat": args.repeat,
        "image_tokens_per_image": tower.tokens_per_image,
        "prompt_tokens_per_row": statistics.median(len(r.prompt_token_ids) for r in requests),
        "preprocess_s": round(preprocess, 3),
        "same_tokens_cached_uncached": last["cached"][0] == last["uncached"][0],
    }
    for name in configs:
        report[name] = summary(walls[name], args.rows, last[name][1])
    if walls["hf"]:
        report["hf"] = summary(walls["hf"], args.rows)
    report["cached_speedup_over_uncached"] = round(
        report["uncached"]["wall_s"] / report["cached"]["wall_s"], 2
    )
    if walls["hf"]:
        report["cached_speedup_over_hf"] = round(
            report["hf"]["wall_s"] / report["cached"]["wall_s"], 2
        )
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
