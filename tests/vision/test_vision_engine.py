"""The mlx-vlm engine on the real tiny vision model, driven on the shared worker."""

from __future__ import annotations

import asyncio

import pytest
from engine.engine_support import collect, run, spec_for, text_of
from vision.vision_support import PROMPT, noise_image, solid_image

from mlxd.engine.types import GenerationRequest, SamplingParams
from mlxd.engine.vision import VisionEngine, load_vision_engine
from mlxd.errors import BadRequest, ServiceUnavailable

pytestmark = pytest.mark.mlx

IMAGE_CHAT = [{"role": "user", "content": [{"type": "text", "text": PROMPT}, {"type": "image"}]}]
TEXT_CHAT = [{"role": "user", "content": "Read the configuration file and report the options"}]


def ask(image=None, max_tokens: int = 16, **kwargs) -> GenerationRequest:
    if "messages" not in kwargs and "prompt" not in kwargs:
        kwargs["messages"] = IMAGE_CHAT if image is not None else TEXT_CHAT
    return GenerationRequest(
        request_id=kwargs.pop("request_id", "v"),
        max_tokens=max_tokens,
        sampling=kwargs.pop("sampling", SamplingParams(temperature=0.0)),
        images=[image] if image is not None else [],
        **kwargs,
    )


async def loaded(worker, path, **overrides) -> VisionEngine:
    return await load_vision_engine(spec_for(path, "eyes", kind="vision", **overrides), worker)


def generate_all(worker, path, requests: list[GenerationRequest], **overrides):
    """Load, run ``requests`` one after another, close; the chunks of each."""

    async def main():
        engine = await loaded(worker, path, **overrides)
        try:
            return [await collect(engine, r) for r in requests]
        finally:
            await engine.close()

    return run(main())


def test_greedy_output_depends_on_the_image_and_repeats_exactly(worker, vision_tiny):
    noise, red, again, text = generate_all(
        worker, vision_tiny, [ask(noise_image()), ask(solid_image()), ask(noise_image()), ask()]
    )
    assert text_of(noise) == text_of(again)
    assert text_of(noise) != text_of(red)
    assert noise[-1].finish_reason == "length"
    assert noise[-1].completion_tokens == 16
    # The image's tokens count in the prompt: more than the text alone.
    image_prompt = noise[-1].prompt_tokens
    assert image_prompt > len(PROMPT.split()) + 4
    assert text[-1].prompt_tokens > 0 and text_of(text)


def test_output_matches_plain_mlx_vlm(worker, vision_tiny):
    from mlx_vlm import apply_chat_template, load, stream_generate

    [chunks] = generate_all(worker, vision_tiny, [ask(noise_image(), max_tokens=12)])
    model, processor = load(str(vision_tiny))
    prompt = apply_chat_template(processor, model.config, IMAGE_CHAT, num_images=1)
    expected = "".join(
        r.text for r in stream_generate(model, processor, prompt, image=[noise_image()], max_tokens=12, temperature=0.0)
    )
    assert text_of(chunks) == expected


def test_concurrent_requests_to_one_vision_model_take_turns(worker, vision_tiny):
    """mlx-vlm keeps M-RoPE state on the model between steps: interleaving two
    generations on it would change both outputs. Taking turns keeps each
    request's output what it is alone."""
    requests = [ask(noise_image(), request_id="a"), ask(solid_image(), request_id="b"), ask(request_id="c")]
    alone = [text_of(c) for c in generate_all(worker, vision_tiny, requests)]

    async def together():
        engine = await loaded(worker, vision_tiny)
        try:
            return await asyncio.gather(*(collect(engine, r) for r in requests)), engine.stats()
        finally:
            await engine.close()

    results, stats = run(together())
    assert [text_of(c) for c in results] == alone
    assert stats["generations"] == 3 and stats["images"] == 2


def test_a_text_model_keeps_decoding_while_the_vision_model_generates(worker, vision_tiny):
    from mlxd.engine.loader import load_text_engine
    from mlxd.factory import ModelRecipe, build_model

    async def main():
        text = await load_text_engine(spec_for(build_model(ModelRecipe("qwen2", "tiny")), "words"), worker)
        eyes = await loaded(worker, vision_tiny)
        arrivals: list[tuple[str, str | None]] = []

        async def consume(engine, request):
            async for chunk in engine.generate(request):
                arrivals.append((engine.name, chunk.finish_reason))

        try:
            await asyncio.gather(
                consume(eyes, ask(noise_image(), max_tokens=40, ignore_eos=True)),
                consume(text, ask(max_tokens=40, ignore_eos=True)),
            )
        finally:
            await eyes.close()
            await text.close()
        return arrivals

    arrivals = run(main())
    first_final = min(i for i, (_, finish) in enumerate(arrivals) if finish)
    assert {name for name, _ in arrivals[:first_final]} == {"eyes", "words"}
    switches = sum(1 for a, b in zip(arrivals, arrivals[1:]) if a[0] != b[0])
    assert switches >= 10


def test_stop_string_cuts_the_output_before_it(worker, vision_tiny):
    [full] = generate_all(worker, vision_tiny, [ask(noise_image(), max_tokens=24)])
    whole = text_of(full)
    stop = whole.strip()[len(whole.strip()) // 2 :][:3]
    [cut] = generate_all(worker, vision_tiny, [ask(noise_image(), max_tokens=24, stop=["never there", stop])])
    assert text_of(cut) == whole[: whole.find(stop)]
    assert (cut[-1].finish_reason, cut[-1].stop_sequence) == ("stop", stop)
    assert cut[-1].completion_tokens < 24


def test_seeded_sampling_is_reproducible_and_seed_dependent(worker, vision_tiny):
    def sampled(seed: int) -> GenerationRequest:
        return ask(noise_image(), sampling=SamplingParams(temperature=1.0, seed=seed))

    first, second, other = generate_all(worker, vision_tiny, [sampled(7), sampled(7), sampled(8)])
    assert text_of(first) == text_of(second)
    assert text_of(first) != text_of(other)


def test_a_raw_prompt_completes_without_a_template(worker, vision_tiny):
    [chunks] = generate_all(worker, vision_tiny, [ask(prompt="def parse_arguments(argv):\n")])
    assert text_of(chunks) and chunks[-1].finish_reason == "length"


def test_abort_all_ends_the_running_and_the_waiting_generation(worker, vision_tiny):
    async def main():
        engine = await loaded(worker, vision_tiny)
        try:
            waiting = asyncio.ensure_future(collect(engine, ask(solid_image(), request_id="second")))
            chunks = []
            aborted = 0
            async for chunk in engine.generate(ask(noise_image(), max_tokens=2000, ignore_eos=True)):
                chunks.append(chunk)
                if len(chunks) == 2:
                    aborted = await engine.abort_all("preempted")
            return chunks, await waiting, aborted, engine.stats()
        finally:
            await engine.close()

    running, waited, aborted, stats = run(main())
    assert aborted == 2
    assert running[-1].finish_reason == "abort" and running[-1].completion_tokens < 20
    assert [c.finish_reason for c in waited] == ["abort"] and waited[0].completion_tokens == 0
    assert stats["aborted"] == 2 and stats["in_flight"] == 0


@pytest.mark.parametrize(
    "request_, message",
    [
        (ask(noise_image(), messages=TEXT_CHAT), "0 image parts but 1 images"),
        (ask(messages=IMAGE_CHAT), "1 image parts but 0 images"),
        (ask(noise_image(), max_tokens=0), "max_tokens"),
        (ask(solid_image(size=(400, 1))), "could not be prepared"),
    ],
    ids=["image-without-a-part", "part-without-an-image", "no-tokens", "odd-shape"],
)
def test_inconsistent_requests_are_bad_requests(worker, vision_tiny, request_, message):
    with pytest.raises(BadRequest, match=message):
        generate_all(worker, vision_tiny, [request_])


def test_a_prompt_longer_than_max_context_counts_the_image(worker, vision_tiny):
    [text] = generate_all(worker, vision_tiny, [ask(max_tokens=1)])
    limit = text[-1].prompt_tokens + 2  # room for the text, not for the image too
    assert generate_all(worker, vision_tiny, [ask(max_tokens=1)], max_context=limit)
    with pytest.raises(BadRequest, match="images included") as err:
        generate_all(worker, vision_tiny, [ask(noise_image())], max_context=limit)
    assert err.value.code == "context_length_exceeded"


def test_close_releases_the_model_memory_and_is_idempotent(worker, vision_tiny):
    from mlxd.engine import memory

    async def main():
        await worker.call(memory.release_memory)
        baseline = await worker.call(memory.active_bytes)
        engine = await loaded(worker, vision_tiny)
        await collect(engine, ask(noise_image()))
        in_use = await worker.call(memory.active_bytes)
        await engine.close()
        await engine.close()
        after = await worker.call(memory.active_bytes)
        with pytest.raises(ServiceUnavailable):
            await collect(engine, ask(noise_image()))
        return baseline, in_use, after, engine.load_bytes, engine.stats()

    baseline, in_use, after, load_bytes, stats = run(main())
    assert load_bytes > 1_000_000  # 1.6 M float32 parameters
    assert in_use - baseline >= load_bytes
    assert after - baseline < load_bytes * 0.05
    assert stats["closed"] and stats["measured_bytes"] >= load_bytes


def test_a_broken_model_folder_is_a_load_failure_that_frees_what_it_took(worker, vision_tiny, tmp_path):
    import shutil

    from mlxd.engine import memory
    from mlxd.errors import ModelLoadFailed

    broken = tmp_path / "broken"
    shutil.copytree(vision_tiny, broken)
    weights = broken / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])

    async def main():
        await worker.call(memory.release_memory)
        baseline = await worker.call(memory.active_bytes)
        with pytest.raises(ModelLoadFailed) as err:
            await loaded(worker, broken)
        return err.value, await worker.call(memory.active_bytes) - baseline

    error, leftover = run(main())
    assert "`eyes` could not be loaded" in error.message and "daemon log" in error.message
    assert leftover < 100_000


def test_a_load_cancelled_by_its_caller_is_unloaded_when_it_finishes(worker, vision_tiny):
    from mlxd.engine import memory

    def held() -> int:
        # Dropping the last reference frees the arrays into MLX's cache; only
        # an unload hands the cache back.
        figures = memory.mlx_memory()
        return figures["active"] + figures["cache"]

    async def main():
        await (await loaded(worker, vision_tiny)).close()  # pays mlx-vlm's import first
        baseline = await worker.call(held)
        task = asyncio.ensure_future(loaded(worker, vision_tiny))
        await asyncio.sleep(0)  # the load is queued on the worker
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        # The orphaned load finishes, then its unload is queued behind it.
        for _ in range(3):
            await worker.call(lambda: None)
        return await worker.call(held) - baseline

    assert run(main()) < 100_000
