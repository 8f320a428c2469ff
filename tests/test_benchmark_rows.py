"""The benchmark's rows in this process, on the tests' tiny data: each trains the same samples, every one of
them once an epoch, shuffled, with the run's optimizer over the steps it takes; each reports its own epochs
(the warm-up apart), data waits and test accuracy. Their clocks are injected: no number read from the machine's
speed is asserted. (``tests/test_benchmark.py`` runs the script itself.)"""

from __future__ import annotations

import argparse
import warnings
from pathlib import Path

import pytest
import torch
from torch import nn

from helpers import make_tiny_data, tiny_recipe
from project.benchmark import loops
from project.training.build import build_datamodule, build_model
from project.training.classifier import optimizer_and_schedule
from project.training.tensor_data import TensorPairs

CPU = torch.device("cpu")
LIMIT, BATCH, EPOCHS = 100, 32, 2  # 4 steps an epoch, the last of 4 samples


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return make_tiny_data(tmp_path_factory.mktemp("bench"), n_train=240, n_test=80)


def args_for(data_dir, **changed) -> argparse.Namespace:
    settings = {"data_dir": str(data_dir), "batch_size": BATCH, "accelerator": "cpu", "precision": "32",
                "num_workers": None, "val_size": None, "limit": LIMIT, "epochs": EPOCHS}
    return argparse.Namespace(**{**settings, **changed})


@pytest.fixture
def bench(data_dir):
    return loops.bench_data(tiny_recipe(), args_for(data_dir), CPU)


def rows_of(inputs: torch.Tensor) -> list[tuple[float, ...]]:
    """The samples in any order (rounded: a sample normalised on another path differs in its last bits)."""
    return sorted(tuple(round(value, 4) for value in row.tolist()) for row in inputs.flatten(1))


class Seen:
    """What a network trains on, batch by batch (its training calls only), and what it is tested on."""

    def __init__(self, bench: loops.BenchData, monkeypatch) -> None:
        self.batches: list[torch.Tensor] = []
        self.tested: list[torch.Tensor] = []
        self.schedules: list[tuple[object, int]] = []
        self.optimizers: list[torch.optim.Optimizer] = []
        make_network, make_optimizer = bench.network, bench.optimizer

        def network():
            net, loss = make_network()
            net.register_forward_pre_hook(
                lambda module, inputs: (self.batches if module.training else self.tested).append(inputs[0].clone()))
            return net, loss

        def optimizer(net, total_steps, device, **kwargs):
            made = make_optimizer(net, total_steps, device, **kwargs)
            self.schedules.append((made[1], total_steps))
            self.optimizers.append(made[0])
            return made

        monkeypatch.setattr(bench, "network", network)
        monkeypatch.setattr(bench, "optimizer", optimizer)

    def epochs(self, per_epoch: int) -> list[torch.Tensor]:
        return [torch.cat(self.batches[i:i + per_epoch]) for i in range(0, len(self.batches), per_epoch)]


class NumberedEpochs:
    """Stands in for a row's clocks: epoch ``i`` (0 the warm-up) takes ``i + 1`` seconds and waits ``10 (i + 1)``."""

    def __init__(self, monkeypatch) -> None:
        timed = waited = 0

        class Timer:
            def __init__(self, device):
                pass

            def __enter__(self):
                nonlocal timed
                timed += 1
                self.seconds = float(timed)
                return self

            def __exit__(self, *exc):
                pass

        class Clock(loops.FetchClock):
            def timed(self, batches):
                nonlocal waited
                waited += 1
                self.seconds = 10.0 * waited
                return iter(batches)

        monkeypatch.setattr(loops, "EpochTimer", Timer)
        monkeypatch.setattr(loops, "FetchClock", Clock)


class NumberedWaits(loops.DataWait):
    """A Lightning row's data waits in place of its fetch clock: epoch ``i`` (0 the warm-up) waits ``10 (i + 1)``."""

    def on_train_epoch_end(self, trainer, pl_module):
        self.epoch_waits.append(10.0 * (len(self.epoch_waits) + 1))


def test_every_row_trains_the_recipes_training_split_cut_to_the_limit_and_tests_on_its_test_split(bench):
    config = bench.config
    assert (config.batch_size, config.accelerator, config.precision, config.pin_memory) == (BATCH, "cpu", "32", False)
    reference = build_datamodule(config, tiny_recipe())
    reference.setup("fit")
    reference.setup("test")
    assert torch.equal(bench.train.inputs, reference.train_set.inputs[:LIMIT])
    assert torch.equal(bench.train.targets, reference.train_set.targets[:LIMIT])
    assert torch.equal(bench.test.inputs, reference.test_set.inputs)
    assert torch.equal(bench.test.targets, reference.test_set.targets)
    # The same samples one at a time, unnormalised: what the article's and the per-sample rows read.
    assert len(bench.per_sample) == LIMIT and not bench.reads_samples
    pixels, labels = zip(*(bench.per_sample[i] for i in range(LIMIT)), strict=True)
    assert torch.allclose(reference.normalize(torch.stack(pixels)), bench.train.inputs, atol=1e-6)
    assert torch.equal(torch.stack(labels), bench.train.targets)
    for per_sample in (None, True):
        fresh = bench.datamodule(per_sample)
        assert fresh is not bench.datamodule(per_sample) and len(fresh.train_set) == LIMIT
        inputs = torch.stack([fresh.train_set[i][0] for i in range(LIMIT)])
        assert torch.allclose(inputs if per_sample is None else reference.normalize(inputs), bench.train.inputs,
                              atol=1e-6)
        assert len(fresh.test_set) == len(reference.test_set)


def test_the_benchmarks_own_settings_reach_its_data(data_dir):
    whole = loops.bench_data(tiny_recipe(), args_for(data_dir, limit=None, val_size=60, num_workers=1), CPU)
    assert len(whole.train) == 240 - 60 and len(whole.per_sample) == 180
    assert whole.config.num_workers == 1 and whole.config.val_size == 60
    assert len(whole.datamodule().train_set) == 180
    beyond = loops.bench_data(tiny_recipe(), args_for(data_dir, limit=1000), CPU)
    assert len(beyond.train) == 240 - 40  # the recipe's validation share held out, the rest kept


def test_a_recipe_read_per_sample_is_read_once_into_normalised_tensors_without_its_augmentation(tmp_path):
    from project.contract import load_recipe
    from tests.disk_recipe.data import write_shapes

    recipe = load_recipe("tests.disk_recipe")
    data = write_shapes(tmp_path, train=30, test=9)
    bench = loops.bench_data(recipe, args_for(data, limit=20, val_size=6, num_workers=0), CPU)
    assert bench.reads_samples and isinstance(bench.train, TensorPairs) and isinstance(bench.test, TensorPairs)
    reference = build_datamodule(bench.config, recipe)
    reference.setup("fit")
    reference.setup("test")
    plain = reference.train_set.dataset  # the training split without its random flips
    assert len(bench.train) == 20 and len(bench.test) == 9 and len(bench.per_sample) == 20
    assert torch.allclose(bench.train.inputs, reference.normalize(torch.stack([plain[i][0] for i in range(20)])))
    assert torch.equal(bench.train.targets, torch.as_tensor([plain[i][1] for i in range(20)]))
    assert torch.allclose(bench.test.inputs, reference.normalize(torch.stack([reference.test_set[i][0]
                                                                              for i in range(9)])))
    fresh = bench.datamodule()
    assert len(fresh.train_set) == 20 and fresh.train_set.augment == fresh.augment
    assert fresh.train_set.seed == reference.train_set.seed
    assert torch.equal(fresh.train_set.dataset[19][0], plain[19][0])


def test_the_network_the_loss_and_the_optimizer_are_the_runs(bench):
    assert bench.steps(3, BATCH) == 3 * 4 and bench.steps(1, 100) == 1 and bench.steps(2, 7) == 2 * 15
    first, loss = bench.network()
    again, _ = bench.network()
    torch.manual_seed(0)
    reference = build_model(bench.config, tiny_recipe())
    for weights in (first.state_dict(), again.state_dict()):
        assert all(torch.equal(weights[k], v) for k, v in reference.model.state_dict().items())
    outputs, targets = torch.randn(5, 10), torch.tensor([0, 1, 2, 3, 9])
    assert torch.equal(loss(outputs, targets), reference.loss(outputs, targets))
    optimizer, schedule = bench.optimizer(first, 12, CPU)
    made, made_schedule = optimizer_and_schedule(reference.model.parameters(), "sgd", 0.2, 0.9, 5e-4, "onecycle",
                                                 None, 12, CPU)
    assert type(optimizer) is type(made) and optimizer.defaults == made.defaults
    rates = []
    for _ in range(12):
        rates.append([group["lr"] for group in optimizer.param_groups] + [g["lr"] for g in made.param_groups])
        optimizer.step()
        schedule.step()
        made.step()
        made_schedule.step()
    assert all(row[0] == row[1] for row in rates) and len({row[0] for row in rates}) > 2


class Shifted(nn.Module):
    """Predicts the class its input's first value names (out of 10)."""

    def __init__(self) -> None:
        super().__init__()
        self.modes: list[bool] = []

    def forward(self, x):
        self.modes.append(self.training)
        return nn.functional.one_hot(x[:, 0].long() % 10, 10).float()


def test_evaluate_counts_the_right_answers_over_every_batch_with_the_network_in_eval_mode():
    n = 2 * loops.EVAL_BATCH_SIZE + 37
    labels = torch.arange(n) % 10
    inputs = labels.float().unsqueeze(1).clone()
    inputs[: n // 4] += 1  # a quarter wrong
    network = Shifted()
    assert loops.evaluate(network, TensorPairs(inputs, labels), CPU) == (n - n // 4) / n
    assert network.modes == [False, False, False] and network.training
    # ``normalize`` maps the test inputs to what the network trained on: here a shift back by one.
    assert loops.evaluate(network, TensorPairs(inputs, labels), CPU, normalize=lambda x: x - 1) == (n // 4) / n


@pytest.mark.parametrize("kind", ["hand", "unfused", "samples", "article"])
def test_a_hand_loop_trains_every_sample_once_an_epoch_shuffled_over_its_whole_schedule(kind, bench, monkeypatch):
    seen = Seen(bench, monkeypatch)
    NumberedEpochs(monkeypatch)
    made: list[torch.optim.Optimizer] = []
    if kind == "article":
        class Recorded(torch.optim.SGD):
            def __init__(self, *a, **k):
                super().__init__(*a, **k)
                made.append(self)

        monkeypatch.setattr(torch.optim, "SGD", Recorded)
    result = loops.hand_loop(kind, args_for(bench.config.data_dir), CPU, "32-true", bench)
    assert result["epoch_times"] == [2.0, 3.0] and result["warm_up_s"] == 1.0
    assert result["wait_times"] == [20.0, 30.0] and result["syncs_per_step"] == 0
    assert [len(b) for b in seen.batches] == [32, 32, 32, 4] * (EPOCHS + 1)
    epochs = seen.epochs(4)
    trained_on = bench.train.inputs if kind != "article" else bench.datamodule().to_image(bench.train.inputs)
    for epoch in epochs:
        assert rows_of(epoch) == rows_of(trained_on)
    assert not torch.equal(epochs[0], epochs[1]) and not torch.equal(epochs[0], trained_on)
    tested = torch.cat(seen.tested)
    assert torch.allclose(tested, bench.test.inputs if kind != "article" else
                          bench.datamodule().to_image(bench.test.inputs), atol=1e-5)
    if kind == "article":
        assert not seen.schedules and [o.defaults["lr"] for o in made] == [loops.ARTICLE_LR]
        assert made[0].defaults["momentum"] == 0
    else:
        [(schedule, total)] = seen.schedules
        assert total == bench.steps(EPOCHS + 1, BATCH) and schedule.last_epoch == total
        # the run's optimizer, with torch's fused kernels but in the row that measures what they save
        assert seen.optimizers[0].defaults["fused"] is (None if kind == "unfused" else True)
    assert 0 <= result["test_acc"] <= 1


def test_a_hand_loops_test_accuracy_is_its_trained_networks(bench, monkeypatch):
    networks = []
    make_network = bench.network

    def network():
        made = make_network()
        networks.append(made[0])
        return made

    monkeypatch.setattr(bench, "network", network)
    result = loops.hand_loop("hand", args_for(bench.config.data_dir, epochs=3), CPU, "32-true", bench)
    assert result["test_acc"] == loops.evaluate(networks[0], bench.test, CPU) > 0.5


def test_augmented_by_hand_applies_the_recipes_augment_with_torchs_own_generator(bench):
    calls = []

    def augment(inputs, generator):
        calls.append(generator)
        return inputs + 1

    wrapped = loops.AugmentedByHand(bench.per_sample, augment)
    assert len(wrapped) == LIMIT
    inputs, target = wrapped[3]
    assert torch.equal(inputs, bench.per_sample[3][0] + 1) and target == bench.per_sample[3][1]
    assert calls == [torch.default_generator]


@pytest.mark.parametrize(("precision", "dtype", "cache"), [
    ("bf16-mixed", torch.bfloat16, True), ("bf16-mixed", torch.bfloat16, False), ("16-mixed", torch.float16, True),
])
def test_a_mixed_precision_autocasts_to_its_type(precision, dtype, cache):
    with loops.autocast(CPU, precision, cache=cache):
        assert torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == dtype
        assert torch.is_autocast_cache_enabled() == cache
    with loops.autocast(CPU, "32-true"), loops.autocast(CPU, "bf16-true"):
        assert not torch.is_autocast_enabled("cpu")


def test_a_host_epoch_is_timed_by_the_hosts_clock(monkeypatch):
    readings = iter([5.0, 7.5])
    monkeypatch.setattr(loops.time, "perf_counter", lambda: next(readings))
    with loops.EpochTimer(CPU) as timer:
        pass
    assert timer.seconds == 2.5


def test_host_syncs_are_counted_from_torchs_warnings_and_none_on_a_cpu():
    def said(text: str) -> warnings.WarningMessage:
        return warnings.WarningMessage(UserWarning(text), UserWarning, "f.py", 1)

    assert loops.syncs_in([said("called a synchronizing CUDA operation"), said("other"),
                           said("synchronized twice")]) == 2
    with pytest.warns(UserWarning), loops.counting_syncs(CPU) as caught:
        warnings.warn("a synchronizing CUDA operation", UserWarning, stacklevel=1)
    assert caught == []


def test_bare_lightning_trains_every_sample_once_an_epoch_over_its_whole_schedule(bench, monkeypatch):
    seen = Seen(bench, monkeypatch)

    class Stats(loops.EpochStats):
        def on_train_epoch_end(self, trainer, pl_module):
            self.epoch_times.append(float(len(self.epoch_times) + 1))

    monkeypatch.setattr(loops, "EpochStats", Stats)
    monkeypatch.setattr(loops, "DataWait", NumberedWaits)
    result = loops.bare_lightning(args_for(bench.config.data_dir), CPU, "32-true", bench)
    assert result["epoch_times"] == [2.0, 3.0] and result["warm_up_s"] == 1.0 and result["wait_times"] == [20.0, 30.0]
    assert [len(b) for b in seen.batches] == [32, 32, 32, 4] * (EPOCHS + 1)
    epochs = seen.epochs(4)
    for epoch in epochs:
        assert rows_of(epoch) == rows_of(bench.train.inputs)
    assert not torch.equal(epochs[0], epochs[1])
    [(schedule, total)] = seen.schedules
    assert total == bench.steps(EPOCHS + 1, BATCH) and schedule.last_epoch == total
    assert torch.allclose(torch.cat(seen.tested), bench.test.inputs)
    assert 0 <= result["test_acc"] <= 1


@pytest.mark.parametrize(("steps_per_call", "per_sample"), [(1, None), ("auto", True)])
def test_the_template_row_is_train_itself_on_the_same_samples(steps_per_call, per_sample, bench, monkeypatch):
    from project.training import run

    calls = []
    real_train = run.train

    def train(config, recipe, datamodule, callbacks):
        result = real_train(config, recipe, datamodule=datamodule, callbacks=callbacks)
        calls.append((config, recipe, datamodule, callbacks, result))
        return result

    monkeypatch.setattr(run, "train", train)

    monkeypatch.setattr(loops, "DataWait", NumberedWaits)
    measured = loops.template(args_for(bench.config.data_dir), bench, steps_per_call, per_sample=per_sample)
    [(config, recipe, datamodule, callbacks, result)] = calls
    assert recipe is bench.recipe and config.name == "bench" and config.max_epochs == EPOCHS + 1
    assert config.steps_per_call == steps_per_call and config.trainer == {"enable_progress_bar": False}
    assert (config.cuda_graphs, config.compile) == (False, None)
    assert config.replace(logdir=bench.config.logdir, name=bench.config.name, max_epochs=bench.config.max_epochs,
                          steps_per_call=bench.config.steps_per_call, trainer=bench.config.trainer,
                          cuda_graphs=bench.config.cuda_graphs) == bench.config
    assert len(datamodule.train_set) == LIMIT and datamodule.per_sample == bool(per_sample)
    [wait] = callbacks
    assert isinstance(wait, NumberedWaits) and measured["wait_times"] == [20.0, 30.0]
    assert measured == {
        "epoch_times": result.epoch_times[1:], "warm_up_s": result.epoch_times[0], "wait_times": [20.0, 30.0],
        "test_acc": float(result.test_metrics["test/acc"]), "steps_per_call": result.steps.k,
        "optimizer_steps": result.optimizer_steps, "cuda_graphs": False, "syncs_per_step": 0.0}
    assert len(result.epoch_times) == EPOCHS + 1 and result.optimizer_steps == bench.steps(EPOCHS + 1, BATCH)
    assert not Path(config.logdir).exists()  # its temporary log folder is gone


def test_a_gpu_rows_data_is_pinned_and_its_precision_the_one_asked(data_dir):
    """The settings a GPU run gets, decided on the CPU (nothing is moved: the splits are only set up)."""
    gpu = loops.bench_data(tiny_recipe(), args_for(data_dir, precision="bf16-mixed"), torch.device("cuda"))
    assert gpu.config.pin_memory and gpu.config.precision == "bf16-mixed"
    assert loops.EpochTimer(torch.device("cuda")).cuda and not loops.EpochTimer(CPU).cuda


def test_a_recipe_without_per_sample_data_has_no_per_sample_rows(tmp_path):
    from helpers import make_bars
    from project.contract import load_recipe

    recipe = load_recipe("tests.second_recipe")
    bench = loops.bench_data(recipe, args_for(make_bars(tmp_path, n_train=50, n_test=10), limit=None), CPU)
    assert bench.per_sample is None and not bench.reads_samples and bench.recipe is recipe


def test_the_optimizer_follows_the_runs_schedule_and_warm_up(bench):
    cosine = loops.BenchData(**{**vars(bench), "config": bench.config.replace(scheduler="cosine", warmup_steps=3)})
    network, _ = cosine.network()
    optimizer, schedule = cosine.optimizer(network, 10, CPU)
    made, made_schedule = optimizer_and_schedule(cosine.network()[0].parameters(), "sgd", 0.2, 0.9, 5e-4, "cosine",
                                                 3, 10, CPU)
    rates = []
    for _ in range(10):
        rates.append((optimizer.param_groups[0]["lr"], made.param_groups[0]["lr"]))
        for each in (optimizer, schedule, made, made_schedule):
            each.step()
    assert all(ours == theirs for ours, theirs in rates) and rates[1][0] > rates[0][0]  # warming up


def test_the_per_sample_hand_loop_reads_through_a_dataloader_as_a_user_writes_it(data_dir, monkeypatch):
    bench = loops.bench_data(tiny_recipe(), args_for(data_dir, num_workers=1), CPU)
    made = []

    class Recorded(torch.utils.data.DataLoader):
        def __init__(self, dataset, **options):
            made.append((dataset, options))
            super().__init__(dataset, **options)

    monkeypatch.setattr(loops, "DataLoader", Recorded)
    loops.hand_loop("samples", args_for(data_dir, num_workers=1), CPU, "32-true", bench)
    [(dataset, options)] = made
    assert dataset is bench.per_sample  # the tests' recipe does not augment
    assert options == {"batch_size": BATCH, "shuffle": True, "num_workers": 1, "pin_memory": False,
                       "persistent_workers": True}


def test_the_per_sample_hand_loop_augments_what_the_recipe_augments(tmp_path, monkeypatch):
    from project.contract import load_recipe
    from tests.disk_recipe.data import ShapesDataModule, write_shapes

    bench = loops.bench_data(load_recipe("tests.disk_recipe"), args_for(write_shapes(tmp_path, 20, 6), limit=None,
                                                                        val_size=4, num_workers=0), CPU)
    wrapped = []

    class Recorded(loops.AugmentedByHand):
        def __init__(self, dataset, augment):
            wrapped.append((dataset, augment))
            super().__init__(dataset, augment)

    monkeypatch.setattr(loops, "AugmentedByHand", Recorded)
    loops.hand_loop("samples", args_for(bench.config.data_dir, epochs=1), CPU, "32-true", bench)
    [(dataset, augment)] = wrapped
    assert dataset is bench.per_sample and augment.__func__ is ShapesDataModule.augment


def test_a_mixed_precision_row_trains_under_autocast(bench, monkeypatch):
    autocast = []
    make_network = bench.network

    def network():
        net, loss = make_network()
        net.register_forward_pre_hook(lambda module, inputs: autocast.append(torch.is_autocast_enabled("cpu"))
                                      if module.training else None)
        return net, loss

    monkeypatch.setattr(bench, "network", network)
    loops.bare_lightning(args_for(bench.config.data_dir, epochs=1), CPU, "bf16-mixed", bench)
    loops.hand_loop("hand", args_for(bench.config.data_dir, epochs=1), CPU, "bf16-mixed", bench)
    assert autocast == [True] * 16
    with loops.autocast(CPU, "bf16-mixed"):
        assert torch.is_autocast_cache_enabled()  # the cache is on unless a capture turns it off


def test_bare_lightning_writes_no_file_and_draws_nothing(bench, tmp_path, monkeypatch, capfd, caplog):
    monkeypatch.chdir(tmp_path)
    with caplog.at_level("INFO"):
        loops.bare_lightning(args_for(bench.config.data_dir, epochs=1), CPU, "32-true", bench)
    assert list(tmp_path.iterdir()) == []
    printed = capfd.readouterr()
    assert "Epoch" not in printed.err + printed.out
    assert "Total params" not in caplog.text + printed.out


def test_the_data_wait_counts_the_training_batches_fetch_only():
    from lightning.pytorch.profilers import PassThroughProfiler

    from helpers import FakeClock

    class Kept(PassThroughProfiler):  # the run's own profiler: it still sees every action
        def __init__(self):
            super().__init__()
            self.seen = []

        def start(self, action_name):
            self.seen.append(("start", action_name))

        def stop(self, action_name):
            self.seen.append(("stop", action_name))

    time = FakeClock()
    clock = loops.FetchClock(now=time)
    kept = Kept()
    profiler = loops.FetchProfiler(clock, kept)
    with profiler.profile("run_training_batch"):
        pass
    assert kept.seen == [("start", "run_training_batch"), ("stop", "run_training_batch")]
    kept.seen.clear()
    profiler.start("[_TrainingEpochLoop].train_dataloader_next")
    time.advance(0.5)
    profiler.stop("[Callback]on_train_batch_start")  # another action ends meanwhile: not the fetch
    time.advance(0.25)
    profiler.stop("[_TrainingEpochLoop].train_dataloader_next")
    time.advance(1.0)
    profiler.stop("[_TrainingEpochLoop].train_dataloader_next")  # no fetch began: nothing to add
    profiler.start("[_EvaluationLoop].val_next")
    time.advance(2.0)
    profiler.stop("[_EvaluationLoop].val_next")
    assert clock.seconds == 0.75
    assert [kind for kind, _ in kept.seen] == ["start", "stop", "stop", "stop", "start", "stop"]


@pytest.mark.parametrize(("cuda_graphs", "compile_mode"), [(True, None), (False, "default")])
def test_the_template_row_passes_its_captures_and_compiling_on(cuda_graphs, compile_mode, bench, monkeypatch):
    from project.training import run

    class Planned(Exception):
        pass

    given = []

    def train(config, recipe, datamodule, callbacks):
        given.append(config)
        raise Planned

    monkeypatch.setattr(run, "train", train)
    with pytest.raises(Planned):
        loops.template(args_for(bench.config.data_dir), bench, "auto", cuda_graphs=cuda_graphs,
                       compile_mode=compile_mode)
    assert (given[0].cuda_graphs, given[0].compile) == (cuda_graphs, compile_mode)
