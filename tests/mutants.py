"""Known bugs, each a small edit of the engine, and the tests that must fail when it is made.

``scripts/mutation_check.py`` applies each to a copy of the template, one at a time, and runs its tests
there: a mutant is caught when one of them fails. A promise the README makes comes with a mutant here
(``docs/tests.md`` lists them). Not collected by pytest (no ``test_`` prefix).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Mutant:
    name: str
    promise: str  # what a user would lose
    file: str  # relative to the template's root
    original: str  # found exactly once in the file
    mutated: str
    tests: tuple[str, ...]  # pytest node ids (relative to the template's root) of which one must fail


# The recipe checks on the example recipes: what a broken variant of either must fail.
SECOND_RECIPE_CHECKS = "tests/test_recipe_checks.py::test_the_example_recipes_pass_every_check[tests.second_recipe]"
DISK_RECIPE_CHECKS = "tests/test_recipe_checks.py::test_the_example_recipes_pass_every_check[tests.disk_recipe]"
# Each attempt of a hostile user, replayed (its case in brackets).
HOSTILE = "tests/test_hostile_inputs.py::test_each_hostile_attempt_ends_in_its_one_line"

MUTANTS = (
    Mutant("runs-share-a-folder", "runs never share a folder",
           "project/reliability/run_folder.py", '(parent / f"version_{number}").mkdir()',
           '(parent / f"version_{number}").mkdir(exist_ok=True)',
           ("tests/test_restarts.py::test_runs_that_choose_the_same_folder_at_the_same_moment_claim_two",)),
    Mutant("stop-skips-a-due-validation", "a stop never skips a validation that is due",
           "project/reliability/stops.py", "if self._agreed(trainer) and not validation_due(trainer):",
           "if self._agreed(trainer):",
           ("tests/test_restarts.py::test_a_stop_at_an_epochs_last_step_waits_for_its_validation",)),
    Mutant("evaluate-without-log-softmax", "evaluate and predict give a logits recipe's loss and probabilities",
           "project/results/evaluation.py",
           "return torch.log_softmax(self.network(inputs.to(dtype)).float(), dim=1)",
           "return self.network(inputs.to(dtype)).float()",
           ("tests/test_second_recipe.py::test_evaluate_and_the_exports_agree_with_training",
            "tests/test_second_recipe.py::test_predict_reads_image_files_the_recipes_way")),
    Mutant("non-finite-flag-never-read", "divergence stops at the first non-finite loss, named by its step",
           "project/training/callbacks.py",
           "    def _check(self, trainer: L.Trainer) -> None:\n        if self._first_bad is not None:",
           "    def _check(self, trainer: L.Trainer) -> None:\n        return\n        if self._first_bad is not None:",
           ("tests/test_gpu_toolkit.py::test_diverging_training_stops_before_any_checkpoint_holds_broken_weights",)),
    Mutant("eval-loss-not-reduced-across-ranks", "DDP val/test metrics equal one process's evaluation",
           "project/training/classifier.py", "self.val_loss, self.test_loss = MeanMetric(), MeanMetric()",
           "self.val_loss, self.test_loss = MeanMetric(sync_on_compute=False), MeanMetric(sync_on_compute=False)",
           ("tests/test_ddp.py::test_two_cpu_processes_write_once_and_match_a_single_process_evaluation",)),
    Mutant("a-host-copy-every-step", "no host sync between logging steps",
           "project/training/classifier.py", "        loss = self.loss(outputs, y)\n",
           "        loss = self.loss(outputs, y)\n        loss.detach().cpu()\n",
           ("tests/test_sync_free.py::test_no_conversion_between_logging_steps",)),
    Mutant("resume-keeps-the-logs-after-its-checkpoint", "a resumed run's curves have no gap and no overlap",
           "project/reliability/resume.py", "    roll_back_logs(folder, resume.global_step)\n", "",
           ("tests/test_restarts.py::test_a_run_stopped_at_any_phase_resumes_to_the_uninterrupted_run[validation-2-KILL]",
            "tests/test_restarts.py::test_a_run_stopped_at_any_phase_resumes_to_the_uninterrupted_run[step-25-KILL]")),
    Mutant("a-group-skips-a-schedule-step", "steps per call never change the training",
           "project/training/steps_per_call.py", "        if scheduler is not None:\n            scheduler.step()",
           "        if scheduler is not None and index:\n            scheduler.step()",
           ("tests/test_steps_per_call.py::test_k_steps_per_call_train_bitwise_like_one",)),
    Mutant("captured-schedule-stands-still", "the captured step follows the run's schedule",
           "project/hardware/device_step.py", "            self.index.add_(1)\n", "",
           ("tests/test_device_step.py::test_the_device_step_trains_like_torch_optim",)),
    Mutant("overflowing-step-not-skipped", "16-mixed skips a step whose gradients overflow",
           "project/hardware/device_step.py", "tensor.copy_(torch.where(skip, before, tensor))",
           "tensor.copy_(tensor)",
           ("tests/test_device_step.py::test_a_step_whose_gradients_overflow_changes_nothing_but_the_loss_scale",)),
    Mutant("auto-never-follows-the-run", "auto steps per call recovers from a first measure taken under load",
           "project/training/steps_per_call.py", '    """Set K from a step\'s measured time, where it moved by more '
                                                 'than a quarter."""\n',
           '    """Set K from a step\'s measured time, where it moved by more than a quarter."""\n    return\n',
           ("tests/test_steps_per_call.py::test_auto_follows_the_runs_own_steps_when_its_first_measure_was_slowed_by_load",)),
    Mutant("save-in-place", "a crash during a save leaves the previous file intact",
           "project/reliability/checkpointing.py",
           'handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)',
           "handle, temporary = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), str(path)",
           ("tests/test_reliability.py::test_a_failed_save_leaves_the_previous_file_intact",)),
    Mutant("broken-weights-saved", "no checkpoint ever holds NaN or inf weights",
           "project/training/callbacks.py", "        if broken:\n            raise NonFiniteLossError(",
           "        if broken and False:\n            raise NonFiniteLossError(",
           ("tests/test_gpu_toolkit.py::test_non_finite_weights_are_never_saved_even_when_the_loss_was_finite",)),
    Mutant("best-by-name", "'best' is the checkpoint with the best recorded score",
           "project/reliability/run_folder.py", '    checkpoints = folder / "checkpoints"\n',
           '    checkpoints = folder / "checkpoints"\n    return max(checkpoints.glob("best-*.ckpt"), default=None)\n',
           ("tests/test_choosing_runs.py::test_best_is_the_recorded_best_score_not_the_last_name",)),
    Mutant("newest-by-version-number", "the newest run is the one that started last, whatever its name",
           "project/reliability/run_folder.py", "key=lambda info: info.started, reverse=True)",
           "key=lambda info: info.folder.name, reverse=True)",
           ("tests/test_choosing_runs.py::test_the_newest_run_is_the_one_that_started_last_whatever_its_name",)),
    Mutant("no-lock-on-the-run-folder", "a run folder is held by one process at a time",
           "project/reliability/run_folder.py",
           "    if folder not in _OWNED:\n        _OWNED[folder] = RunLock(folder).acquire(flag)", "    return",
           ("tests/test_choosing_runs.py::test_a_run_folder_is_held_by_one_process",)),
    Mutant("csv-rows-lost-on-resume", "every logger keeps what the run wrote before its checkpoint",
           "project/training/build.py", "        if kept is not None:\n            path.write_bytes(kept)",
           "        if kept is not None and False:\n            path.write_bytes(kept)",
           ("tests/test_choosing_runs.py::test_csv_logs_keep_their_rows_over_a_resume",)),
    Mutant("password-in-the-logs", "no password is written to any file",
           "project/errors.py", "    text = _USERINFO.sub(", "    return text or _USERINFO.sub(",
           ("tests/test_outputs.py::test_a_run_started_from_a_command_with_credentials_writes_none",)),
    Mutant("only-the-userinfo-masked", "no credential on any output, in any form (query strings, DSNs)",
           "project/errors.py", "    return _KEY_VALUE.sub(", "    return text or _KEY_VALUE.sub(",
           ("tests/test_outputs.py::test_a_run_started_from_a_command_with_credentials_writes_none",)),
    Mutant("lr-finder-bar-in-a-log", "no progress bar in a log, the tuners' included",
           "project/training/tuning.py", "lr_finder.tqdm = functools.partial(drawing, disable=True)",
           "lr_finder.tqdm = drawing",
           ("tests/test_outputs.py::test_the_tuners_draw_no_bar_into_a_log",)),
    Mutant("resume-auto-overwrites-a-finished-run", "--resume auto never replaces a finished run's outputs",
           "project/reliability/run_folder.py", "    done = finished_results(folder)\n    if done is not None:\n"
                                               "        raise NothingToDo(",
           "    done = finished_results(folder)\n    if done is not None and False:\n        raise NothingToDo(",
           ("tests/test_choosing_runs.py::test_resume_auto_leaves_a_finished_run_without_checkpoints_alone",)),
    Mutant("eval-shards-overlap", "DDP evaluation counts each sample once",
           "project/training/tensor_data.py", "return iter(range(self.rank, self.total_size, self.num_replicas))",
           "return iter(range(0, self.total_size, self.num_replicas))",
           ("tests/test_ddp.py::test_eval_shards_cover_the_split_once",)),
    Mutant("resume-before-the-epoch-is-set", "a run that reads files with workers resumes to the same weights",
           "project/training/tensor_data.py", "    return resume_at[0], resume_at\n",
           "    return epoch, resume_at if epoch == resume_at[0] else None\n",
           ("tests/test_disk_recipe.py::test_kill_9_and_resume_end_bitwise_equal_with_workers_and_random_flips",)),
    Mutant("image-polarity-ignored", "predict reads dark-on-light images as the light-on-dark ones it trained on",
           "project/results/image_files.py", "        if dark_background is not None and bool(",
           "        if False and bool(",
           ("tests/test_second_recipe.py::test_predict_reads_image_files_the_recipes_way",)),
    Mutant("recipe-defaults-ignored", "a recipe's defaults are its runs' defaults",
           "project/config/schema.py", "    for name, value in recipe.defaults.items():",
           "    for name, value in {}.items():",
           ("tests/test_config.py::test_the_recipes_defaults_replace_the_engines",)),
    Mutant("lr-finder-reads-the-debiased-start", "--find-lr picks an LR the run trains with",
           "project/training/tuning.py", "SKIP_FIRST = 25", "SKIP_FIRST = 0",
           ("tests/test_gpu_toolkit.py::test_the_lr_finder_picks_a_share_of_where_the_loss_turns_up",)),
    Mutant("resume-forgets-the-runs-settings", "--resume last alone continues the run with its own settings",
           "project/reliability/resume.py", "if key in saved and\n               key not in given}", "if False}",
           ("tests/test_choosing_runs.py::test_resume_last_alone_continues_the_run_with_its_own_settings",)),
    # Written by someone who had not seen the tests: each breaks a promise of the README or docs.
    Mutant("auto-moves-only-by-a-whole-k", "auto steps per call follows the run's steps when they move by a quarter",
           "project/training/steps_per_call.py", "    if abs(k - now) > now / 4:", "    if abs(k - now) > now:",
           ("tests/test_steps_per_call.py::test_auto_follows_the_runs_own_steps_when_its_first_measure_was_slowed_by_load",)),
    Mutant("augmentation-same-every-epoch", "augmentation is seeded by seed, epoch and sample",
           "project/training/tensor_data.py", "hash((self.seed, epoch, index))", "hash((self.seed, index))",
           ("tests/test_documented_promises.py::test_augmentation_differs_across_epochs_and_repeats_across_a_resume",)),
    Mutant("best-by-name-is-the-lowest", "'best' by file names is the highest score",
           "project/reliability/run_folder.py", "return max(scored, key=", "return min(scored, key=",
           ("tests/test_documented_promises.py::test_best_by_file_names_is_the_highest_score",)),
    Mutant("csv-keeps-the-checkpoints-row", "a resumed run's metrics.csv has no row twice",
           "project/reliability/run_folder.py", "if _step_of(row, column) < step]", "if _step_of(row, column) <= step]",
           ("tests/test_documented_promises.py::test_a_resume_cuts_the_csv_back_to_the_rows_below_its_checkpoint",)),
    Mutant("empty-user-password-shown", "a password after an empty user (scheme://:pw@host) is masked",
           "project/errors.py", "[^:/?#@\\s]*):", "[^:/?#@\\s]+):",
           ("tests/test_outputs.py::test_each_credential_form_is_masked_and_nothing_else",)),
    Mutant("float-image-of-max-1-read-as-255", "float images in [0, 1] are read as such",
           "project/results/image_files.py", "float(values.max()) <= 1.0 else", "float(values.max()) < 1.0 else",
           ("tests/test_documented_promises.py::test_a_float_image_whose_brightest_pixel_is_1_is_read_as_0_to_1",)),
    Mutant("shrink-filter-when-one-side-smaller", "an image is shrunk by area only where it is larger on both sides",
           "project/results/image_files.py", "converted.width >= width and converted.height >= height",
           "converted.width >= width or converted.height >= height",
           ("tests/test_documented_promises.py::test_an_image_is_shrunk_by_area_only_where_it_is_larger_on_both_sides",)),
    Mutant("test-loss-mean-of-batch-means", "test/loss is the mean over the test set's samples",
           "project/training/classifier.py", "loss.update(self.loss(outputs, y), weight=y.shape[0])",
           "loss.update(self.loss(outputs, y))",
           ("tests/test_documented_promises.py::test_the_test_loss_is_the_mean_over_samples_not_over_batches",)),
    Mutant("ctrl-c-recorded-as-failed", "Ctrl-C stops a run where it can resume, recorded as stopped",
           "project/reliability/stops.py", 'signal.SIGINT: "Ctrl-C", ', "",
           ("tests/test_documented_promises.py::test_a_run_stopped_by_ctrl_c_is_recorded_as_stopped",)),
    Mutant("kill-9-listed-as-running", "runs.py lists a run killed with kill -9 as killed",
           "project/reliability/run_folder.py", '    if state == "running" and not is_locked(folder):',
           "    if False:",
           ("tests/test_documented_promises.py::test_a_run_killed_with_kill_9_is_listed_as_killed",)),
    Mutant("partial-batch-lost-from-planned-steps", "a resume counts a partial last batch as a step",
           "project/training/tensor_data.py", "batches = batches_of(per_rank, config.batch_size)",
           "batches = per_rank // config.batch_size",
           ("tests/test_documented_promises.py::test_planned_steps_count_a_partial_last_batch",)),
    Mutant("partial-batch-lost-from-steps-per-epoch", "every epoch trains its partial last batch",
           "project/training/tensor_data.py", "return batches_of(len(self.train_set), self.batch_size)",
           "return len(self.train_set) // self.batch_size",
           ("tests/test_documented_promises.py::test_steps_per_epoch_count_a_partial_last_batch",)),
    Mutant("device-step-takes-dampened-sgd", "the device-side step trains as torch.optim does, or runs eagerly",
           "project/hardware/device_step.py", 'if self.sgd and group.get("dampening"):', "if False:",
           ("tests/test_device_step.py::test_what_cannot_be_a_device_step_is_said_in_one_line",)),
    Mutant("garbage-checkpoint-reason-is-a-number", "a damaged checkpoint is refused with what is wrong with it",
           "project/reliability/checkpointing.py", " or isinstance(err, (KeyError, IndexError)):", ":",
           ("tests/test_damaged_records.py::test_a_damaged_checkpoint_is_refused_with_what_is_wrong_with_it",)),
    Mutant("crash-loses-the-steps-since-the-last-save", "a crash writes last.ckpt at the step the run reached",
           "project/reliability/checkpointing.py",
           "if trainer.world_size > 1 and not isinstance(exception, SIGTERMException):",
           "if trainer.world_size > 1 or not isinstance(exception, SIGTERMException):",
           ("tests/test_reliability.py::test_a_crash_writes_last_ckpt_at_the_step_it_reached_and_nothing_before_the_first",)),
    Mutant("process-group-left-to-exit", "a finished DDP run ends with exit 0 on every rank, no abort at exit",
           "project/reliability/cluster.py", "        torch.distributed.destroy_process_group()\n", "        pass\n",
           ("tests/test_ddp.py::test_a_finished_ddp_run_ends_cleanly_on_every_rank_every_time",
            "tests/test_ddp.py::test_ddp_spawn_reports_and_writes_what_ddp_does")),
    Mutant("name-may-be-a-path", "a run's name is one folder under --logdir, never a path out of it",
           "project/config/schema.py", 'setting("run", folder_name, "experiment name',
           'setting("run", text, "experiment name',
           (f"{HOSTILE}[name-absolute]", f"{HOSTILE}[name-in-a-file]")),
    Mutant("logger-named-twice-accepted", "each logger writes each row once",
           "project/config/validators.py", "        if repeated is not None:\n", "        if False:\n",
           (f"{HOSTILE}[logger-named-twice]",)),
    Mutant("trainer-args-unranged", "a Trainer argument out of range is refused before the run's folder exists",
           "project/config/validators.py", "problem = RANGES[key](value) if", "problem = None if",
           (f"{HOSTILE}[limit-inf-in-a-file]", f"{HOSTILE}[max-steps-0]")),
    Mutant("lr-beyond-float32-accepted", "an LR the training dtype cannot hold is refused in one line",
           "project/config/validators.py", "    if number > FLOAT32_MAX:\n", "    if False:\n",
           (f"{HOSTILE}[lr-beyond-float32]",)),
    Mutant("a-pipe-read-as-a-file", "a pipe or device where a file is expected is refused, never read",
           "project/errors.py", "    if path.exists() and not path.is_file():\n", "    if False:\n",
           ("tests/test_bounded_inputs.py::test_what_is_not_a_regular_file_is_named_before_anything_opens_it",)),
    Mutant("libpq-string-taken-for-a-journal", "no file the project creates is named by a credential",
           "project/sweeps/storage.py", 'if "://" not in spec and CONNINFO.match(spec):', "if False:",
           (f"{HOSTILE}[libpq-connection-string]",)),
    Mutant("journal-cut-record-kept", "a journal whose last record was cut goes on from its complete records",
           "project/sweeps/storage.py", "        set_aside_a_cut_record(path)\n", "",
           ("tests/test_hostile_inputs.py::test_a_journal_whose_last_record_was_cut_goes_on_from_its_complete_records",)),
    Mutant("accumulation-beyond-the-epoch", "a run whose steps would barely move the weights is refused",
           "project/training/tensor_data.py", "    if accumulate > batches:", "    if False:",
           (f"{HOSTILE}[accumulation-beyond-the-epoch]",)),
    Mutant("record-nested-too-deep-traceback", "a damaged run record is one line, however it is damaged",
           "project/reliability/run_folder.py", "    except RecursionError:", "    except ZeroDivisionError:",
           (f"{HOSTILE}[run-record-nested-too-deep-evaluate]",)),
    Mutant("escape-sequences-printed", "names and records are printed as text, never as terminal commands",
           "project/errors.py", "        print(terminal_safe(redact(text)), flush=True)",
           "        print(redact(text), flush=True)",
           ("tests/test_hostile_inputs.py::test_what_the_scripts_print_is_terminal_safe",)),
    Mutant("a-run-row-broken-by-its-name", "runs.py shows each run on one row, whatever its name and record hold",
           "scripts/runs.py", "one_field(run.describe())", "run.describe()",
           ("tests/test_hostile_inputs.py::test_runs_py_shows_each_run_on_one_row_whatever_its_name_and_record_hold",)),
    Mutant("another-recipes-checkpoint-read", "another recipe's checkpoint is refused by every script, naming both",
           "project/reliability/checkpointing.py", "    if recorded is not None and recorded != mine:", "    if False:",
           ("tests/test_hostile_inputs.py::test_another_recipes_checkpoint_is_refused_by_every_script_naming_both",)),
    Mutant("requeue-line-left-to-the-end", "a requeued SLURM job's log says where it stopped",
           "project/reliability/stops.py", '        print(f"train.py: {line}", file=sys.stderr, flush=True)\n', "",
           ("tests/test_slurm.py::test_a_job_signalled_before_its_time_limit_requeues_itself_and_ends_as_if_never_stopped",)),
    Mutant("sweep-best-is-the-worst", "a sweep's best.yaml holds its best trial",
           "project/sweeps/report.py", "float(t.value or 0.0), reverse=True)", "float(t.value or 0.0), reverse=False)",
           ("tests/test_documented_promises.py::test_a_sweeps_best_yaml_holds_its_best_trial",)),
    Mutant("card-trusts-the-declared-normalisation",
           "a recipe normalising with other numbers than it declares is refused",
           "project/training/data_card.py", "if low < -RANGE_TOLERANCE or high > 1 + RANGE_TOLERANCE:", "if False:",
           ("tests/test_recipe_checks.py::test_a_recipe_normalising_with_other_numbers_than_it_declares_is_refused",)),
    Mutant("no-training-batch-misnamed", "a run that would take no optimizer step is refused, naming why",
           "project/training/tensor_data.py", "    if limit == 0:\n", "    if False:\n",
           (f"{HOSTILE}[no-training-batch]",)),
    Mutant("key-given-twice-taken", "a key given twice in a YAML file is refused, not the last one taken",
           "project/config/schema.py", "                if key in seen:\n", "                if False:\n",
           ("tests/test_hostile_inputs.py::test_a_key_given_twice_is_refused_in_every_yaml_the_project_reads",
            f"{HOSTILE}[key-given-twice-in-a-file]")),
    Mutant("devices-beyond-the-cores", "a process count far beyond the cores is refused unless asked for",
           "project/hardware/devices.py", "devices > OVERSUBSCRIBED * cores() and", "devices > 10**9 and",
           ("tests/test_hostile_inputs.py::test_devices_are_what_the_accelerator_has_and_what_the_cores_can_run",)),
    Mutant("every-gpu-asked-of-a-cpu", "--devices -1 on a CPU is one line, not Lightning's TypeError",
           "project/hardware/devices.py", "    elif devices == -1:\n", "    elif False:\n",
           ("tests/test_hostile_inputs.py::test_devices_are_what_the_accelerator_has_and_what_the_cores_can_run",)),
    Mutant("val-size-a-data-error", "a validation share that leaves no training split is a usage error (exit 2)",
           "project/training/tensor_data.py", 'raise UsageError(f"--val-size {size}:',
           'raise DataError(f"--val-size {size}:',
           ("tests/test_hostile_inputs.py::test_a_validation_share_that_leaves_no_training_split_is_a_usage_error",)),
    Mutant("empty-folder-predicted-silently", "predict.py on a folder with no files says so, exit 2",
           "project/results/image_files.py", "            if not found:\n", "            if False:\n",
           (f"{HOSTILE}[predict-an-empty-folder]",)),
    Mutant("unnormalised-inputs-told-to-declare", "inputs left unnormalised are named as such, not as numbers",
           "project/training/data_card.py", "        if off and -RANGE_TOLERANCE <= held_low",
           "        if False and -RANGE_TOLERANCE <= held_low",
           ("tests/test_recipe_checks.py::test_statistics_advice_names_the_cause[unnormalised]",)),
    Mutant("twice-normalised-told-to-declare", "inputs normalised twice are named as such",
           "project/training/data_card.py", "        if matches and -RANGE_TOLERANCE",
           "        if False and -RANGE_TOLERANCE",
           ("tests/test_recipe_checks.py::test_statistics_advice_names_the_cause[normalised-twice]",)),
    Mutant("constant-inputs-told-std-0", "constant inputs get their own line, never the advice std = 0",
           "project/training/data_card.py", "        if any(s < CONSTANT_STD for s in self.std):", "        if False:",
           ("tests/test_recipe_checks.py::test_statistics_advice_names_the_cause[constant]",)),
    Mutant("softmax-outputs-unnamed", "outputs that are already probabilities are named as such",
           "project/training/recipe_checks.py", "    if probabilities(out):", "    if False:",
           ("tests/test_recipe_checks.py::test_outputs_advice_names_a_softmax_and_nan[softmax]",)),
    Mutant("nan-outputs-blamed-on-dropout", "a NaN-producing model is named as such, not blamed on dropout",
           "project/training/recipe_checks.py", "    if not bool(torch.isfinite(out).all()):", "    if False:",
           ("tests/test_recipe_checks.py::test_outputs_advice_names_a_softmax_and_nan[nan]",)),
    Mutant("option-check-traceback", "a recipe's option check that fails is one line and a failed recipe check",
           "project/contract.py",
           "            except ValueError:\n                raise\n            except Exception as err:",
           "            except ValueError:\n                raise\n            except ZeroDivisionError as err:",
           ("tests/test_recipe_checks.py::"
            "test_an_option_whose_check_fails_is_a_finding_and_one_line_on_the_command_line",)),
    Mutant("example-data-traceback", "an example_data of another signature is one line",
           "project/contract.py", "            write(folder, train, test, seed)\n        except Exception as err:",
           "            write(folder, train, test, seed)\n        except ZeroDivisionError as err:",
           ("tests/test_recipe_checks.py::test_an_example_data_of_another_signature_is_one_line",)),
    Mutant("no-checkpoint-said-kept", "a failed write says what is on disk: no checkpoint before the first one",
           "project/training/run.py", "    if kept is None and (last is None or not last.is_file()):", "    if False:",
           ("tests/test_restarts.py::test_a_failed_write_says_what_is_on_disk_and_its_cause",)),
    Mutant("file-size-limit-said-as-disk-full", "a file size limit is said as such, not as a full disk",
           "project/reliability/checkpointing.py",
           "    if limit != resource.RLIM_INFINITY and written + (1 << 16) >= limit:", "    if False:",
           ("tests/test_restarts.py::test_a_checkpoint_past_the_file_size_limit_is_said_as_such",)),
    Mutant("stale-best-kept-on-start-over", "--resume auto starting again leaves no checkpoint of the attempt before",
           "project/reliability/run_folder.py", "        stale.unlink()\n", "        pass\n",
           ("tests/test_restarts.py::test_resume_auto_starting_again_leaves_no_checkpoint_of_the_attempt_before",)),
    Mutant("mnist-link-loop-not-found", "an MNIST file that is a link to nowhere is named, not 'MNIST not found'",
           "project/recipe/mnist_files.py", " and not (folder / name).is_symlink()]", "]",
           ("project/recipe/tests/test_mnist_data.py::test_bad_mnist_file_gets_one_line_naming_it[link loop]",)),
    # Fresh bugs of a reader who had not seen the tests (round 3), each a broken promise a user relies on.
    Mutant("resume-resets-the-start-time", "the newest run is the one that started last, resumed or not",
           "project/reliability/run_folder.py", '    if not resumed or "started" not in read_run_record(folder):',
           "    if True:",
           ("tests/test_run_records.py::test_a_resume_keeps_when_its_run_started_so_the_newest_run_stays_the_newest",)),
    Mutant("early-failure-deletes-the-folder", "a run that fails or stops before its first checkpoint keeps its folder",
           "project/reliability/run_folder.py", "if not existed and isinstance(err, UsageError):",
           "if not existed:",
           ("tests/test_run_records.py::test_how_a_run_ended_is_recorded_and_only_a_refused_run_leaves_no_folder",)),
    Mutant("label-equal-to-classes-passes", "the labels check catches a label one past the last class",
           "project/training/recipe_checks.py", "(targets < 0) | (targets >= classes)",
           "(targets < 0) | (targets > classes)",
           ("tests/test_recipe_checks.py::"
            "test_a_label_equal_to_num_classes_fails_the_labels_check_of_a_recipe_read_from_files",)),
    Mutant("std-too-small-accepted", "a std declared far too small is refused like one far too large",
           "project/training/data_card.py", "far_std = any(not (1 / STD_RATIO <= d / max(s, 1e-8) <= STD_RATIO)",
           "far_std = any(not (d / max(s, 1e-8) <= STD_RATIO)",
           ("tests/test_recipe_checks.py::test_statistics_declared_far_from_the_data_are_a_problem",)),
    Mutant("val-confusion-never-reset", "each epoch's validation confusion matrix counts that epoch only",
           "project/results/figures.py", "        self.val_confusion.reset()\n", "",
           ("tests/test_measures.py::test_each_confusion_matrix_counts_its_split_once",)),
    Mutant("credential-keys-case-sensitive", "no credential is written in the clear, whatever its key's casing",
           "project/errors.py", "    re.IGNORECASE,\n", "    0,\n",
           ("tests/test_properties.py::test_a_credential_is_masked_whatever_its_keys_casing_scheme_and_place",
            "tests/test_properties.py::test_the_keys_a_reader_found_written_in_the_clear_are_masked")),
    Mutant("precision-16-true-on-cpu", "--precision 16 on a CPU trains in bf16-mixed, as --help says",
           "project/hardware/devices.py", '_PRECISION_ALIASES = {"16": "16-mixed",',
           '_PRECISION_ALIASES = {"16": "16-true",',
           ("tests/test_measures.py::test_the_precision_a_cpu_run_trains_in_is_the_one_help_promises",
            "tests/test_measures.py::test_a_cpu_run_asked_for_16_records_and_trains_in_bf16_mixed")),
    Mutant("eval-loss-mean-of-batch-means", "evaluate.py's test loss is the mean over samples",
           "project/results/evaluation.py", "loss.update(nn.functional.nll_loss(log_probs, y), weight=len(y))",
           "loss.update(nn.functional.nll_loss(log_probs, y))",
           ("tests/test_measures.py::test_evaluates_test_loss_is_the_mean_over_samples_whatever_the_batches",)),
    Mutant("keyboard-interrupt-recorded-as-failed", "a KeyboardInterrupt that ends a run records it as stopped",
           "project/reliability/run_folder.py", "    elif isinstance(error, (Terminated, KeyboardInterrupt)):",
           "    elif isinstance(error, Terminated):",
           ("tests/test_run_records.py::test_how_a_run_ended_is_recorded_and_only_a_refused_run_leaves_no_folder",)),
    # Broken recipes: each a classic recipe bug in an example recipe, which the recipe checks must catch.
    Mutant('recipe-labels-shuffled', 'the recipe checks catch labels out of step with their inputs (it learns)',
           'tests/second_recipe/data.py', '        return self.normalize(images.float() / 255), labels\n',
           '        return self.normalize(images.float() / 255), labels[torch.randperm(len(labels), '
           'generator=torch.Generator().manual_seed(1))]\n',
           (SECOND_RECIPE_CHECKS,)),
    Mutant('recipe-class-count-too-large', 'the recipe checks catch a class the training split lacks (labels)',
           'tests/second_recipe/data.py', '    num_classes = 4\n',
           '    num_classes = 5\n',
           (SECOND_RECIPE_CHECKS,)),
    Mutant('recipe-output-width', 'the recipe checks catch a network whose output width is not num_classes (outputs)',
           'tests/second_recipe/model.py', 'self.head = nn.Linear(second * 3 * 4, CLASSES)',
           'self.head = nn.Linear(second * 3 * 4, CLASSES + 1)',
           (SECOND_RECIPE_CHECKS,)),
    Mutant('recipe-mean-declared-wrong', 'the recipe checks catch declared statistics the data does not have',
           'tests/second_recipe/data.py', 'mean, std = (0.33, 0.33, 0.33), (0.22, 0.22, 0.22)',
           'mean, std = (0.70, 0.70, 0.70), (0.22, 0.22, 0.22)',
           (SECOND_RECIPE_CHECKS,)),
    Mutant('recipe-test-split-leaks', 'the recipe checks catch test inputs that occur in training (leakage)',
           'tests/second_recipe/data.py', '("train.pt" if train else "test.pt")',
           '("train.pt" if True else "test.pt")',
           (SECOND_RECIPE_CHECKS,)),
    Mutant('recipe-dropout-in-eval', 'the recipe checks catch randomness left on in evaluation',
           'tests/second_recipe/model.py', '        return self.head(self.features(x).flatten(1))',
           '        return self.head(torch.nn.functional.dropout(self.features(x).flatten(1), 0.3, training=True))',
           (SECOND_RECIPE_CHECKS,)),
    Mutant('recipe-batch-statistics-in-eval', 'the recipe checks catch batch statistics used in evaluation',
           'tests/second_recipe/model.py', 'nn.Conv2d(3, first, 3, padding=1), nn.ReLU(),',
           'nn.Conv2d(3, first, 3, padding=1), nn.BatchNorm2d(first, track_running_stats=False), nn.ReLU(),',
           (SECOND_RECIPE_CHECKS,)),
    Mutant('recipe-input-shape-declared-wrong', 'the recipe checks catch inputs of another shape than input_shape',
           'tests/second_recipe/data.py', '    input_shape = (3, 12, 16)\n',
           '    input_shape = (3, 16, 12)\n',
           (SECOND_RECIPE_CHECKS,)),
    Mutant('recipe-8-bit-inputs', 'the recipe checks catch integer inputs',
           'tests/second_recipe/data.py', '        return self.normalize(images.float() / 255), labels\n',
           '        return images, labels\n',
           (SECOND_RECIPE_CHECKS,)),
    Mutant('recipe-input-ignored', 'the recipe checks catch a model that cannot learn (fits one batch)',
           'tests/second_recipe/model.py', '        return self.head(self.features(x).flatten(1))',
           '        return self.head(self.features(x * 0).flatten(1))',
           (SECOND_RECIPE_CHECKS,)),
    Mutant('recipe-augment-global-randomness', 'the recipe checks catch an augment that draws outside its generator',
           'tests/disk_recipe/data.py', 'torch.rand(1, generator=generator).item() < 0.5',
           'torch.rand(1).item() < 0.5',
           (DISK_RECIPE_CHECKS,)),
    Mutant('recipe-augment-changes-the-shape', "the recipe checks catch an augment that changes the input's shape",
           'tests/disk_recipe/data.py', 'return inputs.flip(-1) if',
           'return inputs.flip(-1)[..., 1:] if',
           (DISK_RECIPE_CHECKS,)),
    Mutant('lr-not-scaled-for-several-processes', 'the LR follows the global batch of several processes by default',
           'project/training/tuning.py',
           'return config.scale_lr is True or (config.scale_lr == "auto" and world_size > 1)',
           'return config.scale_lr is True',
           ("tests/test_gpu_toolkit.py::test_the_lr_follows_the_global_batch_of_several_processes_unless_told_not_to",)),
    Mutant('new-recipe-statistics-of-some-files', "a new recipe declares its training images' mean and std",
           'project/scaffold.py', 'mean, std = measured_statistics(folder, train)',
           'mean, std = measured_statistics(folder, train[: len(train) // 2])',
           ("tests/test_new_recipe.py::test_the_declared_statistics_are_the_training_images_as_the_recipe_reads_them",)),
    Mutant('histograms-without-gradients', 'histograms show each weight and its last gradient',
           'project/results/figures.py',
           "{name: p.grad for name, p in classifier(pl_module).model.named_parameters()\n"
           "                              if p.grad is not None}", "{}",
           ("tests/test_after_training.py::test_histograms_every_n_epochs_and_the_graph_on_request_change_no_training",)),
    Mutant('sweep-estimate-one-trial-too-many', "a trial's line estimates the rest of its worker's trials",
           'project/sweeps/study.py', 'statistics.fmean(seconds_each) * trials_left',
           'statistics.fmean(seconds_each) * (trials_left + 1)',
           ("tests/test_sweeps.py::test_the_rest_of_a_workers_trials_is_estimated_from_those_it_ran",)),
    Mutant('conformance-on-the-installed-recipe-only', 'the conformance tests check the recipe a user names',
           'tests/conftest.py', 'os.environ.get("PROJECT_RECIPE", "project.recipe")', '"project.recipe"',
           ("tests/test_documented_promises.py::test_the_conformance_tests_check_the_recipe_a_user_names",)),
    Mutant('cuda-build-where-the-cpu-index-answers', 'a machine without an NVIDIA GPU gets the CPU build of torch',
           'scripts/install_torch.py',
           'return Build.CPU_FROM_CPU_INDEX if cpu_index_reachable else Build.CUDA_FOR_WANT_OF_THE_CPU_INDEX',
           'return Build.CUDA_FOR_WANT_OF_THE_CPU_INDEX',
           ("tests/test_install.py::test_the_build_is_chosen_by_the_gpu_and_the_index",)),
    Mutant('a-shared-datamodule-takes-each-runs-settings', "runs sharing a datamodule each train as planned and "
           "leave it as it was", 'project/training/tensor_data.py', 'run = copy.copy(self)', 'run = self',
           ("tests/test_datamodule.py::test_runs_sharing_a_datamodule_each_train_as_planned_and_leave_it_as_it_was",)),
    Mutant('checkpoint-records-the-lr-before-scaling', "a scaled LR is recorded as trained, so a resume does not "
           "scale it again", 'project/training/run.py', 'record.config = trained', 'record.config = config',
           ("tests/test_gpu_toolkit.py::test_a_scaled_lr_is_recorded_as_trained_so_its_config_and_its_resume_do_not_"
            "scale_it_again",)),
    Mutant('resumed-bar-counts-from-the-resume', "a run resumed mid-epoch counts its bar from the epoch's start",
           'project/training/steps_per_call.py',
           '            self.on_train_epoch_start(trainer, pl_module)\n', '            pass\n',
           ("tests/test_steps_per_call.py::test_a_resumed_runs_bar_counts_its_epoch_from_the_epochs_start",)),
    Mutant('k1-resume-counts-groups-as-steps', "a run resumed with one step per call from a checkpoint written with "
           "several still validates at its epoch's end", 'project/training/steps_per_call.py',
           'counts[key] += shift', 'counts[key] += 0',
           ("tests/test_steps_per_call.py::test_resuming_mid_epoch_gives_the_uninterrupted_state",)),
    Mutant('diverged-trial-not-counted', "a sweep's estimate of the time left counts the trials left, a diverged one "
           "included", 'project/sweeps/study.py',
           '        self.trials_left = max(0, self.trials_left - 1)  # a diverged trial counts too\n', '',
           ("tests/test_sweep_workers.py::test_a_trial_trains_its_settings_on_data_loaded_once_and_says_how_it_went",)),
    Mutant('foreign-journal-traceback', "a journal file another program wrote is one line, not a traceback",
           'project/sweeps/storage.py', 'UNREADABLE_JOURNAL = (ValueError, AssertionError, LookupError, TypeError)',
           'UNREADABLE_JOURNAL = (ValueError, AssertionError)',
           ("tests/test_sweeps.py::test_a_journal_that_cannot_be_used_says_why",)),
)


def copy_template(destination: Path) -> Path:
    """The template's code and tests, without caches, where a mutant can be applied."""
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info")
    for folder in ("project", "scripts", "slurm", "tests"):  # slurm/: the SLURM tests submit its script
        shutil.copytree(ROOT / folder, destination / folder, ignore=ignore)
    for file in ("pyproject.toml", "constraints.txt", "Makefile"):  # read by the tests of installing
        shutil.copy(ROOT / file, destination / file)
    return destination


@dataclass
class Outcome:
    mutant: Mutant
    caught: bool
    seconds: float
    by: str  # the test that failed, or why it counts as missed


def check(mutant: Mutant, template: Path, timeout: float = 600) -> Outcome:
    """Apply ``mutant`` in ``template``, run its tests there, and undo it."""
    path = template / mutant.file
    source = path.read_text()
    if source.count(mutant.original) != 1:
        return Outcome(mutant, False, 0.0, f"its original text is not found once in {mutant.file}: fix the list")
    path.write_text(source.replace(mutant.original, mutant.mutated))
    started = time.perf_counter()
    try:
        done = subprocess.run([sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *mutant.tests],
                              cwd=template, capture_output=True, text=True, timeout=timeout,
                              env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})
    except subprocess.TimeoutExpired:
        return Outcome(mutant, False, time.perf_counter() - started, f"its tests ran past {timeout:.0f} s")
    finally:
        path.write_text(source)
    seconds = time.perf_counter() - started
    failed = [line.split(" ", 2)[1] for line in done.stdout.splitlines() if line.startswith("FAILED ")]
    if done.returncode == 1 and failed:
        return Outcome(mutant, True, seconds, failed[0].split(" - ")[0])
    return Outcome(mutant, False, seconds, "its tests passed" if done.returncode == 0 else
                   f"pytest exited {done.returncode} without a failing test: {done.stdout.strip()[-200:]}")


def check_all(names: list[str] | None = None) -> list[Outcome]:
    chosen = [m for m in MUTANTS if not names or m.name in names]
    with tempfile.TemporaryDirectory(prefix="mutants-") as scratch:
        template = copy_template(Path(scratch) / "template")
        return [check(mutant, template) for mutant in chosen]
