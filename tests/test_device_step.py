"""The step a CUDA graph captures, checked on the CPU: its arithmetic against ``torch.optim`` and the run's own
schedulers, its loss scale, its counters, and whole runs through it (``--cuda-graphs`` on CPU runs it eagerly).
The captured runs themselves are in ``tests/test_gpu.py``."""

import copy

import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch import nn

from helpers import assert_same_training_state, make_tiny_data, tiny_config, tiny_run, train
from project.config.schema import RunConfig
from project.errors import UsageError
from project.hardware.device_step import DeviceStep, NotCapturable, advance_schedule, schedule_table
from project.hardware.devices import StepMode, capture_plan
from project.training.classifier import ClassifierModule, RunningAccuracy, optimizer_and_schedule

STEPS = 60
SCHEDULES = {  # name: (optimizer settings, schedule)
    "onecycle": ({"momentum": 0.9}, "onecycle"),
    "cosine": ({"momentum": 0.9}, "cosine"),
    "none": ({"momentum": 0.9}, "none"),
    "no-momentum": ({"momentum": 0.0}, "onecycle"),
}


def network() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(20, 16), nn.ReLU(), nn.Linear(16, 4))


def setup(net: nn.Module, settings: dict, schedule: str) -> tuple[ClassifierModule, torch.optim.Optimizer, object]:
    module = ClassifierModule(net, num_classes=4)
    optimizer, scheduler = optimizer_and_schedule(module.model.parameters(), "sgd", 0.2, settings["momentum"],
                                                  5e-4, schedule, None, STEPS, torch.device("cpu"))
    return module, optimizer, scheduler


def batches() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    return torch.randn(STEPS, 8, 20, generator=generator), torch.randint(0, 4, (STEPS, 8), generator=generator)


@pytest.mark.parametrize("name", SCHEDULES)
def test_the_schedule_table_holds_the_schedulers_own_values_and_leaves_it_as_it_was(name):
    settings, schedule = SCHEDULES[name]
    _, optimizer, scheduler = setup(network(), settings, schedule)
    before = scheduler.state_dict() if scheduler else None
    table = schedule_table(optimizer, scheduler, STEPS + 1)
    assert (scheduler.state_dict() if scheduler else None) == before
    group = optimizer.param_groups[0]
    expected = []
    for _ in range(STEPS):
        expected.append((group["lr"], group["momentum"]))
        if scheduler:
            advance_schedule(scheduler, 1)
    expected = torch.tensor(expected, dtype=torch.float32)
    if name == "none":
        assert table.shape == (1, 1, 2) and torch.equal(table[0, 0], expected[0])  # constant: one row
    else:
        assert torch.equal(table[:STEPS, 0], expected)  # the float32 of each step's value, exactly


@pytest.mark.parametrize("name", SCHEDULES)
def test_the_device_step_trains_like_torch_optim(name):
    """60 steps of SGD (Nesterov, weight decay) under each schedule: the same weights and momentum to float32
    roundings (the device step multiplies by the LR, torch.optim fuses it into one multiply-add). Measured: at
    most 2.4e-6 of the largest weight after 60 steps (constant LR 0.2), 6e-7 under one-cycle; allowed: 1e-5."""
    settings, schedule = SCHEDULES[name]
    net = network()
    reference, optimizer, scheduler = setup(copy.deepcopy(net), settings, schedule)
    module, device_optimizer, device_scheduler = setup(copy.deepcopy(net), settings, schedule)
    step = DeviceStep(module, device_optimizer, device_scheduler, None, 0, STEPS)
    images, targets = batches()
    for x, y in zip(images, targets, strict=True):
        loss = reference.batch_loss((x, y))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if scheduler:
            scheduler.step()
        assert torch.allclose(step(x, y), loss.detach(), rtol=1e-5, atol=1e-6)
    assert int(step.index) == STEPS
    for a, b, start in zip(reference.parameters(), module.parameters(), net.parameters(), strict=True):
        assert float((a - b).abs().max()) <= 1e-5 * float(a.abs().max())
        assert float((b - start).abs().max()) > 1e-3  # it trained
    if settings["momentum"]:
        for a, b in zip(optimizer.state.values(), device_optimizer.state.values(), strict=True):
            difference = (a["momentum_buffer"] - b["momentum_buffer"]).abs().max()
            assert float(difference) <= 1e-5 * float(a["momentum_buffer"].abs().max())
    # The training accuracy was counted in place by the step, as by the eager one.
    assert int(module.train_acc.total) == int(reference.train_acc.total) == STEPS * 8
    assert int(module.train_acc.correct) == int(reference.train_acc.correct)


class TwoPartNet(nn.Module):
    """A body, a head, and a layer the loss never reaches (a recipe's unused auxiliary head)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.body = nn.Sequential(nn.Flatten(), nn.Linear(20, 16), nn.ReLU())
        self.head = nn.Linear(16, 4)
        self.unused = nn.Linear(3, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


def test_the_device_step_keeps_each_parameter_groups_settings_and_leaves_what_has_no_gradient():
    """Two parameter groups with their own LR, weight decay, momentum, dampening and Nesterov, a frozen bias and a
    layer without gradients: 20 steps as torch.optim.SGD takes them."""
    def built(net: nn.Module) -> tuple[ClassifierModule, torch.optim.Optimizer]:
        module = ClassifierModule(net, num_classes=4)
        net.body[1].bias.requires_grad_(False)
        optimizer = torch.optim.SGD([
            {"params": list(net.body.parameters()), "lr": 0.1, "weight_decay": 1e-2, "momentum": 0.9,
             "nesterov": True},
            {"params": [*net.head.parameters(), *net.unused.parameters()], "lr": 0.03, "weight_decay": 0.0,
             "momentum": 0.5},
        ], lr=0.5)
        return module, optimizer

    net = TwoPartNet()
    reference, optimizer = built(copy.deepcopy(net))
    module, device_optimizer = built(copy.deepcopy(net))
    step = DeviceStep(module, device_optimizer, None, None, 0, 20)
    images, targets = batches()
    for x, y in zip(images[:20], targets[:20], strict=True):
        loss = reference.batch_loss((x, y))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        step(x, y)
    trained, frozen = module.model, net.body[1].bias
    for name, a in reference.model.named_parameters():
        b = trained.get_parameter(name)
        assert float((a - b).abs().max()) <= 1e-5 * float(a.abs().max()), name
    assert torch.equal(trained.body[1].bias, frozen)
    assert all(torch.equal(a, b) for a, b in zip(trained.unused.parameters(), net.unused.parameters(), strict=True))
    assert float((trained.head.weight - net.head.weight).abs().max()) > 1e-3  # the head trained at its own LR


def test_the_host_schedule_jumps_where_stepping_would_take_it():
    for schedule in ("onecycle", "cosine"):
        _, optimizer, stepped = setup(network(), {"momentum": 0.9}, schedule)
        _, optimizer2, jumped = setup(network(), {"momentum": 0.9}, schedule)
        for _ in range(23):
            stepped.step()
        advance_schedule(jumped, 23)
        assert jumped.state_dict() == stepped.state_dict()
        assert optimizer2.param_groups[0]["lr"] == optimizer.param_groups[0]["lr"]
        assert optimizer2.param_groups[0]["momentum"] == optimizer.param_groups[0]["momentum"]


def test_the_table_ends_with_the_schedule_and_leaves_a_tensor_lr_the_same_tensor():
    """One-cycle asked for more steps than it has: its own steps, no error. Adam's tensor LR (a captured step reads
    that very tensor) keeps its identity and value; a stepwise scheduler is moved on step by step."""
    _, optimizer, cycling = setup(network(), {"momentum": 0.9}, "onecycle")
    assert len(schedule_table(optimizer, cycling, STEPS + 25)) == STEPS + 1  # torch refuses the step after that
    module = ClassifierModule(network(), num_classes=4)
    rate = torch.tensor(0.01)
    adam = torch.optim.Adam(module.parameters(), lr=rate, foreach=False)
    onecycle = torch.optim.lr_scheduler.OneCycleLR(adam, max_lr=0.01, total_steps=STEPS, cycle_momentum=False)
    table = schedule_table(adam, onecycle, STEPS)
    assert adam.param_groups[0]["lr"] is rate and float(rate) == float(table[0, 0, 0]) != float(table[30, 0, 0])
    for scheduler_class, settings in ((torch.optim.lr_scheduler.StepLR, {"step_size": 4, "gamma": 0.5}),
                                      (torch.optim.lr_scheduler.ExponentialLR, {"gamma": 0.9})):
        _, stepped_optimizer, _ = setup(network(), {"momentum": 0.9}, "none")
        _, jumped_optimizer, _ = setup(network(), {"momentum": 0.9}, "none")
        stepped, jumped = scheduler_class(stepped_optimizer, **settings), scheduler_class(jumped_optimizer, **settings)
        for _ in range(9):
            stepped.step()
        advance_schedule(jumped, 9)
        assert jumped.state_dict() == stepped.state_dict()
        assert jumped_optimizer.param_groups[0]["lr"] == stepped_optimizer.param_groups[0]["lr"] < 0.2


def test_a_step_whose_gradients_overflow_changes_nothing_but_the_loss_scale():
    module, optimizer, scheduler = setup(network(), {"momentum": 0.9}, "onecycle")
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**16, growth_interval=1)
    step = DeviceStep(module, optimizer, scheduler, scaler, 0, STEPS)
    images, targets = batches()
    step(images[0], targets[0])  # a normal step: weights move, the scale grows (growth_interval 1)
    assert float(scaler.get_scale()) == 2.0**17
    before = [t.detach().clone() for t in step.tensors()[:8]]  # 4 weights, 4 momentum buffers
    huge = images[1] * 3e38
    step(huge, targets[1])  # inf gradients: skipped
    assert all(torch.equal(a, b) for a, b in zip(before, step.tensors()[:8], strict=True))
    assert float(scaler.get_scale()) == 2.0**16 and int(step.loss_scale.growth) == 0
    assert int(step.index) == 2  # the schedule moves on, as with torch's GradScaler and a scheduler
    step(images[2], targets[2])
    assert not torch.equal(before[0], module.model[1].weight)


def test_a_snapshot_brings_back_every_tensor_a_step_changes():
    """A capture warms the step up on the run's own tensors, then puts them back: the weights, the momentum, the
    loss scale and its growth counter, the schedule's place and the accuracy counted in place."""
    module, optimizer, scheduler = setup(network(), {"momentum": 0.9}, "onecycle")
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**16, growth_interval=2)
    step = DeviceStep(module, optimizer, scheduler, scaler, 0, STEPS)
    images, targets = batches()
    step(images[0], targets[0])

    def state() -> list[torch.Tensor]:
        buffers = [b for s in optimizer.state.values() for b in s.values() if torch.is_tensor(b)]
        counters = [step.loss_scale.scale, step.loss_scale.growth, step.index, module.train_acc.correct,
                    module.train_acc.total]
        return [t.detach().clone() for t in (*module.parameters(), *buffers, *counters)]

    before = state()
    saved = step.snapshot()
    for x, y in zip(images[1:4], targets[1:4], strict=True):
        step(x, y)
    moved = [not torch.equal(a, b) for a, b in zip(before, state(), strict=True)]
    assert all(moved[:8]) and all(moved[-5:])  # weights, momentum and every counter changed
    step.restore(saved)
    assert all(torch.equal(a, b) for a, b in zip(before, state(), strict=True))


@pytest.mark.parametrize(("settings", "k", "plan"), [
    ({}, 2, (StepMode.GRAPHS, "each optimizer step replayed from one capture")),
    ({}, 1, (StepMode.OFF, "--steps-per-call 1: a graph replays the steps of a group")),
    ({"compile": "default"}, 8, (StepMode.OFF, "--compile makes its own graphs")),
    ({"detect_anomaly": True}, 8, (StepMode.OFF, "--detect-anomaly checks every backward on the host")),
])
def test_a_gpu_run_left_to_auto_is_captured_from_two_steps_per_call_or_says_why_not(settings, k, plan):
    assert capture_plan(RunConfig(cuda_graphs="auto", **settings), "cuda", k) == plan


def test_what_cannot_be_a_device_step_is_said_in_one_line():
    module = ClassifierModule(network(), num_classes=4)
    adam = torch.optim.Adam(module.parameters(), lr=0.01)  # not capturable, a Python LR
    with pytest.raises(NotCapturable, match="capturable=True and a tensor LR"):
        DeviceStep(module, adam, None, None, 0, STEPS)
    for setting in ("maximize", "differentiable"):
        sgd = torch.optim.SGD(module.parameters(), lr=0.01, **{setting: True})
        with pytest.raises(NotCapturable, match="SGD with maximize or differentiable is not a device-side step"):
            DeviceStep(module, sgd, None, None, 0, STEPS)
    damped = torch.optim.SGD(module.parameters(), lr=0.01, momentum=0.9, dampening=0.3)
    with pytest.raises(NotCapturable, match="SGD with dampening"):  # its first step would differ from torch's
        DeviceStep(module, damped, None, None, 0, STEPS)
    frozen = ClassifierModule(network().requires_grad_(False), num_classes=4)
    with pytest.raises(NotCapturable, match="^the optimizer has no trainable parameters$"):
        DeviceStep(frozen, torch.optim.SGD(frozen.parameters(), lr=0.1), None, None, 0, STEPS)
    rmsprop = torch.optim.RMSprop(module.parameters(), lr=0.01)
    with pytest.raises(NotCapturable, match="SGD, Adam or AdamW, not RMSprop"):
        DeviceStep(module, rmsprop, None, None, 0, STEPS)
    optimizer = torch.optim.Adam(module.parameters(), lr=0.01)
    cycling = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=0.01, total_steps=STEPS)
    with pytest.raises(NotCapturable, match="changes the optimizer's 'betas' every step"):
        schedule_table(optimizer, cycling, STEPS)


def test_running_accuracy_counts_in_place_and_resets_where_it_is():
    metric = RunningAccuracy()
    correct, total = metric.correct, metric.total
    metric.update(torch.tensor([[0.1, 0.9], [0.8, 0.2], [0.3, 0.7]]), torch.tensor([1, 1, 1]))
    assert metric.correct is correct and int(correct) == 2 and int(total) == 3
    assert float(metric.compute()) == pytest.approx(2 / 3)
    metric.reset()
    assert metric.correct is correct and int(correct) == 0 and int(metric.total) == 0
    metric.update(torch.tensor([[0.0, 1.0]]), torch.tensor([1]))
    metric.replayed(4)  # what a graph replays adds to these tensors without calling update
    assert metric.update_count == 5 and float(metric.compute()) == 1.0


def test_running_accuracys_update_at_a_step_is_its_own_work_counted_once_as_torchmetrics_counts(recwarn):
    """torchmetrics' wrapper around ``update`` (four Python calls through nn.Module's ``__setattr__``, a grad mode)
    cost as much as the update itself at every training step: the metric's update runs without it, counts its calls
    as the wrapper would, also once unpickled (a spawned DDP rank's copy), and still works as a torchmetrics call."""
    import pickle
    import sys

    scores, targets = torch.tensor([[0.1, 0.9], [0.8, 0.2]]), torch.tensor([1, 1])
    fresh = RunningAccuracy()
    fresh.update(scores, targets)
    for metric in (fresh, pickle.loads(pickle.dumps(fresh))):
        calls: list[str] = []

        def note(frame, event, arg, calls=calls):
            if event == "call":
                calls.append(frame.f_code.co_qualname)

        sys.setprofile(note)
        try:
            metric.update(scores, targets)
        finally:
            sys.setprofile(None)
        assert len(calls) <= 3 and not any("setattr" in call or "wrap" in call for call in calls), calls
        assert metric.update_count == 2 and int(metric.correct) == 2 and int(metric.total) == 4
        assert float(metric(scores, targets)) == 0.5 and metric.update_count == 3  # forward: the batch's value
        assert float(metric.compute()) == pytest.approx(3 / 6)
    assert not [w for w in recwarn if "before the ``update``" in str(w.message)]


def test_where_cuda_graphs_go_and_where_they_are_refused():
    assert capture_plan(RunConfig(), "cuda", 8)[0] is StepMode.GRAPHS  # the default on a GPU
    assert capture_plan(RunConfig(), "cpu", 8) == (StepMode.OFF, "cpu: CUDA graphs need a GPU")
    assert capture_plan(RunConfig(cuda_graphs=True), "cpu", 8)[0] is StepMode.DEVICE
    assert capture_plan(RunConfig(cuda_graphs=False), "cuda", 8) == (StepMode.OFF, "--no-cuda-graphs")
    for config, k, why in [
        (RunConfig(), 1, "DDP all-reduces"),
        (RunConfig(compile="default"), 8, "--compile makes its own graphs"),
        (RunConfig(optimizer="adam", scheduler="onecycle"), 8, "one-cycle cycles adam's beta1"),
        (RunConfig(detect_anomaly=True), 8, "--detect-anomaly"),
    ]:
        mode, reason = capture_plan(config, "cuda", k, "DDP all-reduces gradients once per forward")
        assert mode is StepMode.OFF and why in reason
        with pytest.raises(UsageError, match=f"--cuda-graphs: not possible here .*{why}"):
            capture_plan(config.replace(cuda_graphs=True), "cuda", k, "DDP all-reduces gradients once per forward")
    for precision in ("32", "bf16-mixed", "16-mixed"):  # every precision: 16-mixed's loss scale stays on the device
        assert capture_plan(RunConfig(precision=precision), "cuda", 8)[0] is StepMode.GRAPHS


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    # 520 training images at batch 32: 17 optimizer steps per epoch, the last one a partial batch of 8.
    return make_tiny_data(tmp_path_factory.mktemp("device") / "data", n_train=560, n_test=40)


def run(data, folder, **settings):
    every_5 = ModelCheckpoint(dirpath=folder / "every5", filename="{step}", every_n_train_steps=5, save_top_k=-1)
    settings = {"steps_per_call": 8, "max_epochs": 2, "cuda_graphs": True, "checkpoint_every_n_steps": 5,
                "log_every_n_steps": 50, **settings}
    result = train(tiny_config(data, folder, **settings), callbacks=[every_5])
    return result, torch.load(result.last_checkpoint, weights_only=True)


def test_a_run_through_the_device_step_resumes_mid_epoch_bitwise(data, tmp_path, monkeypatch):
    taken = []
    device_step = DeviceStep.__call__
    monkeypatch.setattr(DeviceStep, "__call__", lambda step, *batch: (taken.append(1), device_step(step, *batch))[1])
    full, uninterrupted = run(data, tmp_path / "full")
    assert full.steps.mode is StepMode.DEVICE and full.optimizer_steps == 34
    assert len(taken) == 34  # every optimizer step went through the device step
    middle = tmp_path / "full" / "every5" / "step=25.ckpt"  # epoch 1, 8 steps into it
    _, resumed = run(data, tmp_path / "resumed", resume=str(middle))
    assert_same_training_state(uninterrupted, resumed)
    eager, eager_state = run(data, tmp_path / "eager", cuda_graphs=False)
    for key, value in eager_state["state_dict"].items():  # the same training, to float32 roundings
        torch.testing.assert_close(uninterrupted["state_dict"][key], value, rtol=1e-4, atol=1e-5)


def test_cuda_graphs_on_cpu_say_what_they_do(shared_tiny_data, tmp_path):
    done = tiny_run(shared_tiny_data, tmp_path / "logs", "--cuda-graphs", "--max-epochs", "1", "--accelerator",
                    "cpu")
    assert done.returncode == 0, done.stderr
    assert "CUDA graphs' step run eagerly (no GPU here: --cuda-graphs checks their arithmetic on cpu)" in done.stdout
