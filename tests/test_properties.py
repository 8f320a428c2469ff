"""Properties over spaces of inputs (hypothesis), each against a reference written another way: credentials masked
whatever their key's casing, scheme or place; a run record read or refused in one line whatever its fields hold; the
planned optimizer steps equal to counting them; every sample once per epoch on every rank from any resume point;
any image read as the recipe's input, or refused in one line."""

from __future__ import annotations

import json
import string
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from project.config.schema import RunConfig
from project.errors import redact
from project.training.tensor_data import planned_steps, train_batches

FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

# ---------------------------------------------------------------- credentials

KEYS = ("password", "sslpassword", "passwd", "pwd", "api_key", "apikey", "token", "access_token", "secret",
        "client_secret", "x-amz-credential", "x-amz-security-token", "wandb_api_key", "private_key", "passphrase")
SECRETS = st.text(string.ascii_letters + string.digits + "!$%()*+-._~", min_size=6, max_size=24).filter(
    lambda s: any(c.isdigit() for c in s) and any(c.isalpha() for c in s))


def any_casing(key: str) -> st.SearchStrategy[str]:
    return st.lists(st.booleans(), min_size=len(key), max_size=len(key)).map(
        lambda upper: "".join(c.upper() if u else c.lower() for c, u in zip(key, upper, strict=True)))


@FAST
@given(st.sampled_from(KEYS).flatmap(any_casing), SECRETS,
       st.sampled_from(("postgresql", "postgresql+psycopg", "mysql+pymysql", "https", "s3", "redis")),
       st.integers(0, 2), st.sampled_from(("url", "dsn", "env", "encoded", "encoded-lower")))
def test_a_credential_is_masked_whatever_its_keys_casing_scheme_and_place(key, secret, scheme, place, form):
    others = [f"user{i}=alice" for i in range(2)]
    pairs = [*others[:place], f"{key}={secret}", *others[place:]]
    # A URL carried inside another URL's query: its own '?', '=' and '&' percent-encoded.
    encoded = "%3F" + "%26".join(pairs).replace("=", "%3D")
    text = {"url": f"{scheme}://db.example:5432/optuna?{'&'.join(pairs)}",
            "dsn": " ".join(pairs), "env": f"export {key.upper()}={secret}; train",
            "encoded": f"https://login.example/go?next={scheme}%3A%2F%2Fdb.example%2Foptuna{encoded}",
            "encoded-lower": "https://login.example/go?next=%2fdb" + encoded.replace("%3D", "%3d").replace("%3F",
                                                                                                           "%3f"),
            }[form]
    masked = redact(f"storage {text} refused")
    assert secret not in masked, masked
    assert "alice" in masked or form == "env"  # only the credential goes


@FAST
@given(SECRETS, st.sampled_from(("postgresql", "mysql", "https")), st.text(string.ascii_lowercase, min_size=1,
                                                                           max_size=8))
def test_a_urls_password_is_masked_whatever_it_holds(secret, scheme, user):
    password = secret + "@:/?"  # raw separators inside the password itself
    assert secret not in redact(f"{scheme}://{user}:{password}@host/db")


# ---------------------------------------------------------------- run records

JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=20),
                    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children,
                                                                                      max_size=4), max_leaves=12)
FIELDS = ("state", "started", "step", "error", "pid", "host", "limited", "best_score")


@FAST
@given(st.dictionaries(st.sampled_from(FIELDS), JSON, max_size=len(FIELDS)))
def test_a_run_record_is_read_or_refused_in_one_line_whatever_its_fields_hold(tmp_path_factory, fields):
    from project.reliability.run_folder import DamagedRecord, read_run_record

    folder = tmp_path_factory.mktemp("run")
    (folder / "run.json").write_text(json.dumps(fields))
    try:
        record = read_run_record(folder)
    except DamagedRecord as err:
        assert "\n" not in str(err) and str(folder) in str(err)
    else:
        assert isinstance(record, dict)


# ---------------------------------------------------------------- planned optimizer steps


def counted_batches(size: int, world: int, batch: int, limit: int | float | None) -> int:
    """Each rank's padded shard in batches, cut by the limit (a share rounds down, as Lightning's does)."""
    shard = size // world + (size % world > 0)
    batches = len(range(0, shard, batch))
    if isinstance(limit, float):
        return int(batches * limit)
    return batches if limit is None else min(batches, limit)


def counted_steps(batches: int, epochs: int, accumulate: int, max_steps: int) -> int:
    """Lightning's rules, step by step: an optimizer step every ``accumulate`` batches and at each epoch's last;
    the fit ends at ``max_steps``."""
    steps = 0
    for _ in range(epochs):
        for index in range(batches):
            if (index + 1) % accumulate == 0 or index == batches - 1:
                steps += 1
                if steps == max_steps:
                    return steps
    return steps


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 5000), st.integers(1, 8), st.integers(1, 512), st.integers(1, 6),
       st.none() | st.integers(1, 50) | st.floats(0.05, 1.0), st.integers(1, 8), st.integers(-1, 400))
def test_the_planned_steps_are_the_steps_counted_one_by_one(size, world, batch, epochs, limit, accumulate, max_steps):
    """Counted, or refused in one line exactly where the count says the run cannot train: no batch at all, or an
    accumulation beyond the epoch's batches."""
    from project.errors import UsageError

    max_steps = -1 if max_steps == 0 else max_steps
    trainer = {"accumulate_grad_batches": accumulate, "max_steps": max_steps,
               **({"limit_train_batches": limit} if limit is not None else {})}
    config = RunConfig(batch_size=batch, max_epochs=epochs, trainer=trainer)
    batches = counted_batches(size, world, batch, limit)
    if batches == 0 or accumulate > batches:
        with pytest.raises(UsageError, match="limit_train_batches" if batches == 0 else "accumulate_grad_batches"):
            planned_steps(config, size, world)
        return
    assert train_batches(config, size, world) == batches
    assert planned_steps(config, size, world) == counted_steps(batches, epochs, accumulate, max_steps)


# ---------------------------------------------------------------- samplers


@settings(max_examples=150, deadline=None)
@given(st.integers(1, 300), st.integers(0, 2**31 - 1), st.integers(0, 5), st.data())
def test_every_sample_once_an_epoch_from_any_resume_point(size, seed, epoch, data):
    from project.training.tensor_data import EpochShuffleSampler

    sampler = EpochShuffleSampler(list(range(size)), seed=seed)
    sampler.set_epoch(epoch)
    whole = list(sampler)
    assert sorted(whole) == list(range(size))
    done = data.draw(st.integers(0, size))
    resumed = EpochShuffleSampler(list(range(size)), seed=seed)
    resumed.resume(epoch, done)
    assert whole[:done] + list(resumed) == whole  # the resumed epoch trains exactly the samples not yet trained on


@settings(max_examples=150, deadline=None)
@given(st.integers(1, 300), st.integers(1, 8), st.integers(0, 2**31 - 1), st.integers(0, 5), st.data())
def test_every_sample_on_some_rank_each_epoch_and_each_rank_resumes_its_own(size, world, seed, epoch, data):
    from project.training.tensor_data import EpochShardSampler, EvalShardSampler

    shards = []
    for rank in range(world):
        sampler = EpochShardSampler(list(range(size)), num_replicas=world, rank=rank, seed=seed)
        sampler.set_epoch(epoch)
        shards.append(list(sampler))
    assert len({len(shard) for shard in shards}) == 1  # every rank takes as many steps
    assert set().union(*shards) == set(range(size))
    assert sum(map(len, shards)) - size < world  # padding repeats fewer samples than there are ranks
    rank, done = data.draw(st.integers(0, world - 1)), data.draw(st.integers(0, len(shards[0])))
    resumed = EpochShardSampler(list(range(size)), num_replicas=world, rank=rank, seed=seed)
    resumed.resume(epoch, done)
    assert shards[rank][:done] + list(resumed) == shards[rank]
    evaluated = [i for r in range(world) for i in EvalShardSampler(list(range(size)), num_replicas=world, rank=r)]
    assert sorted(evaluated) == list(range(size))  # evaluation: each sample exactly once over the ranks


# ---------------------------------------------------------------- image files

MODES = ("1", "L", "LA", "P", "RGB", "RGBA", "CMYK", "I;16", "I", "F")


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.sampled_from(MODES), st.integers(1, 96), st.integers(1, 96), st.integers(0, 2**32 - 1),
       st.sampled_from(("png", "tiff", "bmp", "jpeg", "webp")))
def test_any_image_is_read_as_the_recipes_input_or_refused_in_one_line(tmp_path_factory, mode, width, height, seed,
                                                                       suffix):
    import numpy as np
    from PIL import Image

    from project.errors import ImageError
    from tests.tiny_recipe.data import TinyDataModule

    rng = np.random.default_rng(seed)
    image = Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8), "RGB").convert(mode)
    if mode in ("I", "F"):  # wide ranges: 16-bit counts, floats beyond [0, 1]
        image = Image.fromarray(rng.uniform(-1e3, 7e4, (height, width)).astype(np.float32 if mode == "F" else np.int32))
    path = tmp_path_factory.mktemp("image") / f"image.{suffix}"
    try:
        image.save(path)
    except (OSError, ValueError, KeyError):
        return  # a mode the format cannot hold: nothing to read
    datamodule = TinyDataModule(Path("unused"))
    try:
        read = datamodule.read_image(path)
    except ImageError as err:
        assert "\n" not in str(err)
        return
    assert tuple(read.shape) == datamodule.input_shape and read.dtype == torch.float32
    assert bool(torch.isfinite(read).all())
    pixels = read * torch.tensor(datamodule.std).view(-1, 1, 1) + torch.tensor(datamodule.mean).view(-1, 1, 1)
    assert float(pixels.min()) >= -1e-4 and float(pixels.max()) <= 1 + 1e-4  # normalised pixels in [0, 1]


@pytest.mark.parametrize("key", ["?Password=", "X-Amz-Credential=", "X-Amz-Security-Token=", "WANDB_API_KEY=",
                                 "%3Fpassword%3D", "%3fclient_secret%3d", "&token%3D"])
def test_the_keys_a_reader_found_written_in_the_clear_are_masked(key):
    assert "hunter22" not in redact(f"https://bucket.example/object{key}hunter22&x=1")
