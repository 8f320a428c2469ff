"""Several optimizer steps per Lightning step is the same training: same weights, checkpoints, logs."""

import re
import types

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from helpers import (
    FakeClock,
    assert_same_training_state,
    event_accumulator,
    make_tiny_data,
    tiny_config,
    tiny_recipe,
    train,
)
from project.config.schema import RunConfig
from project.errors import UsageError
from project.training.build import build_model
from project.training.callbacks import RunsFirst
from project.training.steps_per_call import StepsPerCall, choose_steps_per_call
from project.training.tensor_data import EpochShuffleSampler, StepGroups, group_ends_at


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    # 520 training images at batch 32: 17 optimizer steps per epoch, the last one a partial batch of 8.
    return make_tiny_data(tmp_path_factory.mktemp("spc") / "data", n_train=560, n_test=40)


def run(data, folder, steps_per_call, callbacks=(), **settings):
    every_5 = ModelCheckpoint(dirpath=folder / "every5", filename="{step}", every_n_train_steps=5, save_top_k=-1)
    settings = {"max_epochs": 2, **settings}
    result = train(tiny_config(data, folder, steps_per_call=steps_per_call, **settings),
                   callbacks=[*callbacks, *([every_5] if settings.get("checkpoint_every_n_steps") else [])])
    return result, torch.load(result.last_checkpoint, weights_only=True)


class Validations(L.Callback):
    """The epochs whose end was validated (the sanity check aside)."""

    def __init__(self) -> None:
        self.epochs: list[int] = []

    def on_validation_epoch_end(self, trainer, pl_module):
        if not trainer.sanity_checking:
            self.epochs.append(trainer.current_epoch)


@pytest.mark.parametrize("precision", ["32", "bf16-mixed"])
def test_k_steps_per_call_train_bitwise_like_one(data, tmp_path, precision, monkeypatch):
    from project.training import steps_per_call

    reference, reference_state = run(data, tmp_path / "k1", 1, precision=precision, log_every_n_steps=50)
    assert reference.steps.k == 1 and reference_state["global_step"] == 34
    eight, state = run(data, tmp_path / "k8", 8, precision=precision, log_every_n_steps=50)
    assert eight.steps.k == 8
    assert_same_training_state(reference_state, state)
    assert eight.test_metrics == reference.test_metrics
    # auto, on a step as fast as a GPU's: the measurement asks for many steps per call
    monkeypatch.setattr(steps_per_call, "measure_step_seconds", lambda *args: 2e-5)
    auto, state = run(data, tmp_path / "kauto", "auto", precision=precision, log_every_n_steps=50)
    assert "(auto: a step's math takes 0.02 ms" in auto.summary()
    assert_same_training_state(reference_state, state)


class StepClock:
    """A clock for ``AutoStepsPerCall`` (``time`` stand-in): ``seconds`` per optimizer step the run has taken, and
    ``fixed`` per Lightning step it has started (its loop, hooks and callbacks): the load went away after auto's
    first measure, whatever this machine is doing now."""

    def __init__(self, seconds: float = 0.0015, fixed: float = 0.001) -> None:
        self.trainer, self.seconds, self.fixed, self.calls = None, seconds, fixed, 0

    def perf_counter(self) -> float:
        if self.trainer is None:
            return 0.0
        return self.seconds * self.trainer.global_step + self.fixed * self.calls


class Watch(RunsFirst):
    """Counts each Lightning step as it starts, before any other callback reads the clock."""

    def __init__(self, clock: StepClock) -> None:
        self.clock = clock

    def on_train_start(self, trainer, pl_module):
        self.clock.trainer = trainer

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.clock.calls += 1


@pytest.mark.parametrize(("first", "own", "fixed", "start", "expected"),
                         [(0.05, 0.0015, 0.001, 1, 25), (0.0015, 0.0008, 0.001, 25, 50),
                          (0.0015, 0.0015, 0.0004, 25, 10)])
def test_auto_follows_the_runs_own_steps_and_fixed_cost(data, tmp_path, monkeypatch, first, own, fixed, start,
                                                        expected):
    """Measured at a moment of load (50 ms a step), auto starts at 1 step per call; the run's own steps, timed at
    each group's end (1.5 ms each from then on), take it up, and the training is the same. A smaller move counts
    too: K doubles from 25 to 50 when the steps turn out half as long (a move of a whole K, not more than it). And
    the fixed cost of a call is the run's own, not the first guess: 0.4 ms where 1 ms was guessed takes K down."""
    from project.training import steps_per_call

    _, reference = run(data, tmp_path / "k1", 1, log_every_n_steps=50, max_epochs=3)
    monkeypatch.setattr(steps_per_call, "measure_step_seconds", lambda *args: first)
    clock = StepClock(own, fixed)
    monkeypatch.setattr(steps_per_call, "time", clock)
    auto = train(tiny_config(data, tmp_path / "auto", steps_per_call="auto", log_every_n_steps=50, max_epochs=3),
                 callbacks=[Watch(clock)])
    state = torch.load(auto.last_checkpoint, weights_only=True)
    # 27 steps of 1.5 ms, aligned to the logging interval: 25; 50 steps of 0.8 ms: 50; 11 of 1.5 ms at 0.4 ms: 10
    assert steps_per_call.steps_for(first, 50) == start
    assert steps_per_call.steps_for(own, 50, fixed) == expected
    assert auto.steps.k == expected, auto.summary()
    assert (f"(auto: a step's math takes {own * 1e3:.2f} ms, a call's fixed cost {fixed * 1e3:.2f} ms, as the run "
            f"timed its own; {start} at first, then {expected})") in auto.summary()
    timed = auto.steps.timed
    assert timed.step_seconds == pytest.approx(own) and timed.fixed_seconds == pytest.approx(fixed)
    assert_same_training_state(reference, state)
    assert state["run_record"]["steps_per_call"] == auto.steps.k  # what a resume takes


def following(followed: list) -> object:
    """A run's stepper that notes each time auto hands it instead of following it."""
    from project.training.steps_per_call import lightnings_own_steps

    stepper = lightnings_own_steps()
    stepper.follow = lambda trainer, times: followed.append(times)
    return stepper


def test_a_moment_of_load_in_one_group_moves_nothing(monkeypatch):
    """auto follows the median of the run's last groups: one group slowed tenfold does not move K."""
    from project.training import steps_per_call

    followed = []
    clock = iter([0.0, 0.0,  # the first group: its end only starts the count
                  0.001, 0.011,  # fixed 1 ms, 10 steps of 1 ms
                  0.012, 0.022, 0.023, 0.033,
                  0.034, 0.134])  # a group ten times slower
    monkeypatch.setattr(steps_per_call, "time", types.SimpleNamespace(perf_counter=lambda: next(clock)))
    trainer = types.SimpleNamespace(strategy=types.SimpleNamespace(root_device=torch.device("cpu")), global_step=0)
    module = types.SimpleNamespace(stepper=following(followed))
    auto = steps_per_call.AutoStepsPerCall()
    for _ in range(5):
        auto.on_train_batch_start(trainer, module, None, 0)
        trainer.global_step += 10
        auto.on_train_batch_end(trainer, module, None, None, 0)
    assert [round(t.step_seconds, 6) for t in followed] == [0.001, 0.001, 0.001, 0.001]
    assert [round(t.fixed_seconds, 6) for t in followed] == [0.001, 0.001, 0.001, 0.001]


def test_checkpoints_and_logs_land_on_the_same_steps(data, tmp_path):
    settings = {"checkpoint_every_n_steps": 5, "log_every_n_steps": 4, "optimizer": "adamw", "lr": 0.01}
    one, _ = run(data, tmp_path / "k1", 1, **settings)
    eight, _ = run(data, tmp_path / "k8", 8, **settings)
    saved = sorted(p.name for p in (tmp_path / "k1" / "every5").iterdir())
    assert saved == sorted(p.name for p in (tmp_path / "k8" / "every5").iterdir())
    assert saved == [f"step={s}.ckpt" for s in (10, 15, 20, 25, 30, 5)]
    for name in saved:  # each holds the state after exactly that step
        assert_same_training_state(torch.load(tmp_path / "k1" / "every5" / name, weights_only=True),
                          torch.load(tmp_path / "k8" / "every5" / name, weights_only=True))
    events = [event_accumulator(r.run_dir) for r in (one, eight)]
    for tag in ("train/loss", "train/lr"):
        curves = [[(p.step, p.value) for p in e.Scalars(tag)] for e in events]
        assert curves[0] == curves[1], tag
        assert [step for step, _ in curves[0]] == [3, 7, 11, 15, 19, 23, 27, 31]
    assert events[0].Scalars("train/samples_per_s")[0].step == events[1].Scalars("train/samples_per_s")[0].step


def test_groups_follow_the_steps_that_must_stay_exact():
    groups = list(StepGroups(520, 32, 3, torch.device("cpu"), lambda: (1, 17), 8, (5,)))
    sizes = [len(g) // 32 + (len(g) % 32 > 0) for g in groups]
    order = EpochShuffleSampler(range(520), seed=3)
    order.set_epoch(1)
    assert torch.cat(groups).tolist() == list(order)  # the same order as one batch at a time
    assert sizes == [3, 4, 1, 5, 2, 2]  # ends at steps 20, 24 (K), 25, 30, 32 (K), 34 (the epoch's end)
    assert group_ends_at(40, 8, (50,)) and group_ends_at(50, 8, (50,)) and not group_ends_at(45, 8, (50, 0))


def test_runs_that_count_lightning_steps_take_one_step_per_call():
    cpu = torch.device("cpu")
    for settings, reason in [({"trainer": {"accumulate_grad_batches": 2}}, "--trainer.accumulate_grad_batches"),
                             ({"fast_dev_run": True}, "--fast-dev-run"), ({"find_lr": True}, "tuners"),
                             ({"strategy": "fsdp"}, "--strategy fsdp wraps the model's forward"),
                             ({"strategy": "deepspeed_stage_2"}, "--strategy deepspeed_stage_2 wraps")]:
        chosen = choose_steps_per_call(RunConfig(**settings), 1, cpu)
        assert chosen.k == 1 and chosen.auto and reason in chosen.why
        with pytest.raises(UsageError, match=r"--steps-per-call 8: not possible here"):
            choose_steps_per_call(RunConfig(steps_per_call=8, **settings), 1, cpu)
    chosen = choose_steps_per_call(RunConfig(devices=2, accelerator="cpu"), 2, cpu)
    assert chosen.k == 1 and "DDP" in chosen.why and chosen.describe().startswith("auto: DDP")
    assert choose_steps_per_call(RunConfig(steps_per_call=1), 2, cpu) == StepsPerCall(1, "as asked")
    # Lightning's own defaults, given explicitly, count nothing: all the batches (1.0), no step limit.
    defaults = {"limit_train_batches": 1.0, "max_steps": -1, "accumulate_grad_batches": 1}
    asked = choose_steps_per_call(RunConfig(steps_per_call=8, trainer=defaults), 1, cpu)
    assert asked == StepsPerCall(8, "as asked")
    with pytest.raises(UsageError, match=r"--trainer.limit_train_batches counts Lightning steps"):
        choose_steps_per_call(RunConfig(steps_per_call=8, trainer={"limit_train_batches": 1}), 1, cpu)  # one batch


def test_clipping_under_auto_trains_one_step_per_call_and_clips(data, tmp_path):
    """docs/speed.md: --trainer.gradient_clip_val counts Lightning steps, so auto takes K = 1 and Lightning clips."""
    clip = {"trainer": {"gradient_clip_val": 0.05}, "max_epochs": 1, "cuda_graphs": False}
    auto, auto_state = run(data, tmp_path / "auto", "auto", **clip)
    assert auto.steps.planned == StepsPerCall(1, "--trainer.gradient_clip_val counts Lightning steps", auto=True)
    one, one_state = run(data, tmp_path / "one", 1, **clip)
    assert_same_training_state(one_state, auto_state)
    _, free_state = run(data, tmp_path / "free", 1, max_epochs=1, cuda_graphs=False)
    assert any(not torch.equal(free_state["state_dict"][key], tensor)  # the clipping took effect
               for key, tensor in auto_state["state_dict"].items())
    with pytest.raises(UsageError) as refused:
        run(data, tmp_path / "four", 4, **clip)
    assert str(refused.value) == ("--steps-per-call 4: not possible here (--trainer.gradient_clip_val counts Lightning "
                                  "steps); use --steps-per-call 1 or auto")


@pytest.mark.parametrize(("settings", "world_size", "per_sample", "why"), [
    ({}, 2, False, "DDP all-reduces gradients once per forward of its wrapper, so each Lightning step takes one batch"),
    ({"strategy": "fsdp"}, 1, False, "--strategy fsdp wraps the model's forward, and a Lightning step must be one "
                                     "forward and backward of it"),
    ({"fast_dev_run": True}, 1, False, "--fast-dev-run runs one batch per stage"),
    ({"find_lr": True}, 1, False, "the tuners drive Lightning's own loop"),
    ({}, 1, True, "the recipe reads its samples one by one from load_samples: a batch per Lightning step"),
    ({"trainer": {"max_steps": 10}}, 1, False, "--trainer.max_steps counts Lightning steps"),
])
def test_each_reason_for_one_step_per_call_is_said_whole_and_refuses_even_two(settings, world_size, per_sample, why):
    from types import SimpleNamespace

    cpu, datamodule = torch.device("cpu"), SimpleNamespace(per_sample=per_sample)
    assert choose_steps_per_call(RunConfig(**settings), world_size, cpu, datamodule) == StepsPerCall(1, why, auto=True)
    with pytest.raises(UsageError) as refused:
        choose_steps_per_call(RunConfig(steps_per_call=2, **settings), world_size, cpu, datamodule)
    assert str(refused.value) == f"--steps-per-call 2: not possible here ({why}); use --steps-per-call 1 or auto"


@pytest.mark.parametrize(("log_every", "k"), [(50, 50), (48, 48), (7, 7), (128, 64)])
def test_steps_a_cuda_graph_will_capture_start_at_the_largest_k_and_are_timed_after_the_capture(log_every, k):
    """No eager probe on the GPU where a capture will time the step itself: K starts at the most (the divisor of the
    logging interval nearest 64), to be set from the captured step's time."""
    chosen = choose_steps_per_call(RunConfig(log_every_n_steps=log_every), 1, torch.device("cuda"))
    assert chosen == StepsPerCall(k, "from the captured step's time", auto=True, until_captured=True)


@pytest.mark.parametrize(("written_with", "k"), [(1, 1), (1, 8), (8, 1)])
def test_resuming_mid_epoch_gives_the_uninterrupted_state(data, tmp_path, written_with, k):
    _, uninterrupted = run(data, tmp_path / "full", written_with, checkpoint_every_n_steps=5, log_every_n_steps=50)
    middle = tmp_path / "full" / "every5" / "step=25.ckpt"  # epoch 1, 8 steps into it
    assert torch.load(middle, weights_only=True)["TinyDataModule"] == {"epoch": 1, "samples_done": 8 * 32,
                                                                         "world_size": 1}
    validations = Validations()
    _, resumed = run(data, tmp_path / "resumed", k, checkpoint_every_n_steps=5, log_every_n_steps=50,
                     resume=str(middle), callbacks=[validations])
    assert_same_training_state(uninterrupted, resumed)
    assert validations.epochs == [1]  # the resumed epoch still ends with its validation, whichever K counted it


@pytest.mark.parametrize(("written_with", "k"), [(1, 8), (8, 8), (8, 1)])
def test_resuming_from_the_end_of_an_epoch_gives_the_uninterrupted_state(data, tmp_path, written_with, k):
    settings = {"scheduler": "none", "log_every_n_steps": 50}
    _, uninterrupted = run(data, tmp_path / "full", 1, **settings)  # 2 epochs
    first = train(tiny_config(data, tmp_path / "first", steps_per_call=written_with, max_epochs=1, **settings))
    _, resumed = run(data, tmp_path / "resumed", k, resume=first.last_checkpoint, **settings)
    assert_same_training_state(uninterrupted, resumed)


def test_auto_times_the_runs_own_step_and_ignores_passing_pauses(shared_tiny_data, monkeypatch):
    """The measured step is the recipe's ``batch_loss`` on the run's batch; pauses that come and go (a busy
    machine) do not count, a step that is always slow does."""
    import time
    from pathlib import Path

    from project.training import steps_per_call
    from project.training.build import build_datamodule
    from tests.tiny_recipe.model import LitTiny

    config = tiny_config(shared_tiny_data, Path("unused"), batch_size=16)
    datamodule = build_datamodule(config, tiny_recipe())
    datamodule.setup("fit")
    seen, calls, clock = [], [], FakeClock()  # the step's time is told, not met: any machine speed

    def new_model(config):
        return build_model(config, tiny_recipe())

    real_batch_loss = LitTiny.batch_loss

    def batch_loss(module, batch):
        seen.append(tuple(batch[0].shape))
        calls.append(None)
        clock.advance(0.05 if len(calls) <= 4 else 0.002)  # the first steps meet a busy machine
        return real_batch_loss(module, batch)

    monkeypatch.setattr(LitTiny, "batch_loss", batch_loss)
    quick = steps_per_call.measure_step_seconds(config, datamodule, torch.device("cpu"), new_model, budget_s=0.2,
                                                clock=clock)
    assert quick == pytest.approx(0.002) and seen[0] == (16, 1, 28, 28)  # the run's batch, through the recipe's step
    monkeypatch.setattr(LitTiny, "batch_loss", lambda module, batch: (clock.advance(0.05), real_batch_loss(
        module, batch))[1])
    slow = steps_per_call.measure_step_seconds(config, datamodule, torch.device("cpu"), new_model, budget_s=0.2,
                                               clock=clock)
    assert slow == pytest.approx(0.05)
    monkeypatch.setattr(LitTiny, "batch_loss", lambda module, batch: (time.sleep(0.05), real_batch_loss(
        module, batch))[1])  # a real 50 ms: any machine is at least that slow
    chosen = choose_steps_per_call(config.replace(steps_per_call="auto"), 1, torch.device("cpu"), datamodule,
                                   new_model)
    # 50 ms of math: Lightning's 1 ms is 2 % of it, not worth grouping
    assert chosen.k == 1
    assert re.fullmatch(r"a step's math takes \d+\.\d\d ms, a call's fixed cost 1\.0 ms as first guessed", chosen.why)


class BarSeen(L.Callback):
    def __init__(self) -> None:
        self.counts: list[tuple[int, int]] = []
        self.postfix = ""

    def on_train_epoch_end(self, trainer, pl_module):
        bar = trainer.progress_bar_callback.train_progress_bar
        self.counts.append((bar.n, bar.total))
        self.postfix = bar.postfix or ""


def test_the_progress_bar_counts_optimizer_steps_and_shows_the_logged_loss(data, tmp_path):
    """With 4 optimizer steps per Lightning step the bar still counts 17 steps an epoch, not 5 groups."""
    seen = BarSeen()
    result = train(tiny_config(data, tmp_path, steps_per_call=4, max_epochs=2, trainer={"enable_progress_bar": True}),
                   callbacks=[seen], test=False)
    assert result.steps.k == 4
    assert seen.counts == [(17, 17), (17, 17)]
    assert "train/loss=" in seen.postfix  # the value logged at the last logging step


def test_a_resumed_runs_bar_counts_its_epoch_from_the_epochs_start(data, tmp_path):
    """Resumed 8 steps into its second epoch, the bar counts that epoch's 17 steps, not 17 from the resume."""
    _, first = run(data, tmp_path / "first", 1, checkpoint_every_n_steps=5, log_every_n_steps=50)
    assert first["global_step"] == 34
    seen = BarSeen()
    train(tiny_config(data, tmp_path / "resumed", steps_per_call=4, max_epochs=2, log_every_n_steps=50,
                      resume=str(tmp_path / "first" / "every5" / "step=25.ckpt"),
                      trainer={"enable_progress_bar": True}), callbacks=[seen], test=False)
    assert seen.counts == [(17, 17)]


def test_the_steps_per_call_line_says_k_and_why():
    from project.hardware.devices import StepMode
    from project.training.steps_per_call import StepsTaken, StepTimes

    def line(planned: StepsPerCall, k: int, step_seconds: float | None = None, timed: StepTimes | None = None) -> str:
        return StepsTaken(planned, k, step_seconds, StepMode.OFF, "", timed).describe_k()

    assert line(StepsPerCall(8, "as asked"), 8) == "as asked"
    timed = StepsPerCall(4, "a step's math takes 0.1 ms", auto=True)
    assert line(timed, 4) == "auto: a step's math takes 0.1 ms"
    assert line(timed, 16) == "auto: a step's math takes 0.1 ms; 4 at first, then 16"
    own = StepTimes(0.0011, 0.0024)
    assert line(timed, 16, timed=own) == ("auto: a step's math takes 1.10 ms, a call's fixed cost 2.40 ms, as the run "
                                          "timed its own; 4 at first, then 16")
    assert line(timed, 4, timed=own) == ("auto: a step's math takes 1.10 ms, a call's fixed cost 2.40 ms, as the run "
                                         "timed its own")
    captured = StepsPerCall(64, "the most, until the capture times a step", auto=True, until_captured=True)
    assert line(captured, 64, 0.00123) == "auto: a captured step takes 1.230 ms, a call's fixed cost 1.0 ms as first " \
                                          "guessed"
    assert line(captured, 64) == "auto: 64, the most (no step was captured)"


PLANS = [  # train size, batch, epochs, --trainer.* settings
    (100, 32, 2, {}),
    (96, 32, 3, {"accumulate_grad_batches": 2}),
    (100, 16, 2, {"accumulate_grad_batches": 3}),
    (100, 16, 3, {"max_steps": 10}),
    (100, 16, 3, {"max_steps": -1}),
    (100, 10, 2, {"limit_train_batches": 4}),
    (100, 10, 2, {"limit_train_batches": 0.35, "accumulate_grad_batches": 2}),
    (70, 8, 4, {"limit_train_batches": 0.5, "max_steps": 9}),
]


@pytest.mark.parametrize(("size", "batch", "epochs", "settings"), PLANS)
def test_planned_steps_are_the_optimizer_steps_lightning_takes(size, batch, epochs, settings):
    """The reference is a real fit: its global_step, under Lightning's own limits, accumulation and max_steps."""
    import lightning as L

    from project.config.schema import RunConfig
    from project.training.tensor_data import planned_steps

    class Linear(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(2, 2)

        def training_step(self, batch, batch_idx):
            return self.layer(batch[0]).sum()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    data = torch.utils.data.TensorDataset(torch.randn(size, 2))
    trainer = L.Trainer(accelerator="cpu", max_epochs=epochs, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, **settings)
    trainer.fit(Linear(), torch.utils.data.DataLoader(data, batch_size=batch))
    config = RunConfig(batch_size=batch, max_epochs=epochs, trainer=settings)
    assert planned_steps(config, size, 1) == trainer.global_step


@pytest.mark.parametrize(("size", "world_size", "batch"), [(100, 2, 16), (101, 2, 16), (99, 4, 8), (7, 3, 2)])
def test_train_batches_per_rank_are_those_of_the_distributed_sampler(size, world_size, batch):
    from project.config.schema import RunConfig
    from project.training.tensor_data import train_batches

    sampler = torch.utils.data.DistributedSampler(range(size), num_replicas=world_size, rank=0, shuffle=False)
    loader = torch.utils.data.DataLoader(range(size), batch_size=batch, sampler=sampler)
    assert train_batches(RunConfig(batch_size=batch), size, world_size) == len(loader)


MEASURED = "a step's math takes 10.00 ms, a call's fixed cost 1.0 ms as first guessed"


@pytest.fixture
def measured_10_ms(monkeypatch):
    """auto's measurement of the run's step, injected: 10 ms, whatever this machine's speed (K 4 for logging every
    8 steps). What it was asked to time is kept."""
    from project.training import steps_per_call

    asked = []

    def measure(config, datamodule, device, new_model):
        asked.append((config.batch_size, datamodule, device.type, new_model))
        return 0.01

    monkeypatch.setattr(steps_per_call, "measure_step_seconds", measure)
    return asked


@pytest.mark.parametrize(("settings", "resumed_k", "steps", "grouped", "ends"), [
    ({}, None, StepsPerCall(4, MEASURED, auto=True), True, (8, 0)),
    ({"checkpoint_every_n_steps": 6}, None, StepsPerCall(4, MEASURED, auto=True), True, (8, 6)),
    ({"steps_per_call": 4}, 4, StepsPerCall(4, "as the run it resumes chose", auto=True), True, (8, 0)),
    ({"steps_per_call": 4}, 2, StepsPerCall(4, "as asked"), True, (8, 0)),
    ({"steps_per_call": 2}, None, StepsPerCall(2, "as asked"), True, (8, 0)),
    ({"steps_per_call": 1}, None, StepsPerCall(1, "as asked"), False, (8, 0)),
    ({"fast_dev_run": True}, None, StepsPerCall(1, "--fast-dev-run runs one batch per stage", auto=True), False,
     (8, 0)),
], ids=["measured", "checkpoints", "resumed-taking-its-k", "asked-other-than-the-resumed", "two-asked", "one-asked",
        "one-for-a-reason"])
def test_a_plan_takes_k_from_the_runs_own_step_or_the_run_it_resumes(tmp_path, measured_10_ms, settings, resumed_k,
                                                                     steps, grouped, ends):
    from project.hardware.devices import StepMode
    from project.training.build import build_datamodule
    from project.training.steps_per_call import plan_steps

    config = tiny_config(make_tiny_data(tmp_path / "data"), tmp_path / "logs", **{
        "steps_per_call": "auto", "batch_size": 512, "log_every_n_steps": 8, "cuda_graphs": False, **settings})
    datamodule = build_datamodule(config, tiny_recipe())
    plan = plan_steps(config, datamodule, build_model, resumed_k)
    assert (plan.steps, plan.grouped, plan.group_ends_every) == (steps, grouped, ends)
    assert (plan.mode, plan.mode_reason, plan.follows_timing) == (StepMode.OFF, "--no-cuda-graphs",
                                                                  config.steps_per_call == "auto")
    assert measured_10_ms == ([(200, datamodule, "cpu", build_model)] if steps.why == MEASURED else [])  # a batch
    # never larger than the training split; a resumed auto run takes its K as its config's (continue_in_its_folder)


def test_auto_keeps_a_k_of_one_grouped_where_it_may_raise_it_and_not_where_a_reason_holds_it(tmp_path, monkeypatch):
    from project.training import steps_per_call
    from project.training.build import build_datamodule
    from project.training.steps_per_call import plan_steps

    monkeypatch.setattr(steps_per_call, "measure_step_seconds", lambda *args: 1.0)  # a slow step: K 1 for now
    config = tiny_config(make_tiny_data(tmp_path / "data"), tmp_path / "logs", steps_per_call="auto",
                         cuda_graphs=False)
    slow = plan_steps(config, build_datamodule(config, tiny_recipe()), build_model)
    assert (slow.steps.k, slow.grouped) == (1, True)
    per_sample = plan_steps(config, build_datamodule(config, tiny_recipe(), per_sample=True), build_model)
    assert per_sample.steps == StepsPerCall(1, "the recipe reads its samples one by one from load_samples: a batch "
                                            "per Lightning step", auto=True)
    assert not per_sample.grouped


def test_auto_counts_a_groups_fetch_with_its_steps_not_in_the_fixed_cost(monkeypatch):
    """The fetch of a group's batches grows with K: it is the steps' cost, not the Lightning step's. Timed through
    Lightning's profiler hooks around it, in a profiler that is the run's own again when training ends."""
    from lightning.pytorch.profilers import PassThroughProfiler

    from project.training import steps_per_call

    now = [0.0]
    monkeypatch.setattr(steps_per_call, "time", types.SimpleNamespace(perf_counter=lambda: now[0]))
    followed = []
    module = types.SimpleNamespace(stepper=following(followed))
    own = PassThroughProfiler()
    trainer = types.SimpleNamespace(strategy=types.SimpleNamespace(root_device=torch.device("cpu")), global_step=0,
                                    profiler=own)
    auto = steps_per_call.AutoStepsPerCall()
    auto.on_train_start(trainer, module)
    for _ in range(4):
        now[0] += 0.0005  # Lightning's loop
        trainer.profiler.start("[_TrainingEpochLoop].train_dataloader_next")
        now[0] += 0.002  # the group's 10 batches gathered
        trainer.profiler.stop("[_TrainingEpochLoop].train_dataloader_next")
        now[0] += 0.0005  # hooks and callbacks
        auto.on_train_batch_start(trainer, module, None, 0)
        now[0] += 0.010
        trainer.global_step += 10
        auto.on_train_batch_end(trainer, module, None, None, 0)
    assert len(followed) == 3
    assert followed[-1].step_seconds == pytest.approx(0.0012) and followed[-1].fixed_seconds == pytest.approx(0.001)
    auto.on_train_end(trainer, module)
    assert trainer.profiler is own


def test_a_fetch_profiler_leaves_the_chain_whichever_order_they_go():
    from lightning.pytorch.profilers import PassThroughProfiler

    from project.training.callbacks import FetchClock, FetchProfiler

    for first_out in (True, False):
        own = PassThroughProfiler()
        trainer = types.SimpleNamespace(profiler=own)
        inner = FetchProfiler.around(trainer, FetchClock())
        outer = FetchProfiler.around(trainer, FetchClock())
        assert trainer.profiler is outer and outer.kept is inner and inner.kept is own
        for profiler in (inner, outer) if first_out else (outer, inner):
            profiler.remove(trainer)
        assert trainer.profiler is own
