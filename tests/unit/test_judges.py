"""Each stage's pure verdict on hand-made results: pass, fail at the boundary, missing data."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from campaign.stages import long_run, loss_check, resume_test, scaling, smoke


def losses(start: int, stop: int, value: float) -> dict[int, float]:
    return {s: value for s in range(start, stop + 1)}


class TestLossCheck:
    steps = list(range(46, 51))

    def test_within_tolerance_passes_and_states_both_numbers(self) -> None:
        v = loss_check.judge(losses(1, 50, 3.05), losses(1, 50, 3.0), self.steps, 0.10)
        assert v.passed
        assert "3.0500 vs reference 3.0000" in v.reason and "+0.0500" in v.reason
        assert v.numbers["difference"] == pytest.approx(0.05)

    @pytest.mark.parametrize("delta", [0.10, -0.10])
    def test_exactly_the_tolerance_passes(self, delta: float) -> None:
        assert loss_check.judge(losses(1, 50, 2.5 + delta), losses(1, 50, 2.5), self.steps, 0.10).passed

    @pytest.mark.parametrize("delta", [0.1001, -0.1001, 0.2])
    def test_just_outside_fails(self, delta: float) -> None:
        v = loss_check.judge(losses(1, 50, 2.5 + delta), losses(1, 50, 2.5), self.steps, 0.10)
        assert not v.passed and "outside ±0.1" in v.reason

    def test_reference_missing_the_check_steps_is_an_error(self) -> None:
        v = loss_check.judge(losses(1, 50, 3.0), losses(1, 40, 3.0), self.steps, 0.10)
        assert not v.passed
        assert "reference has no loss for steps 46-50 (it has steps 1-40)" in v.reason

    def test_run_missing_steps_fails(self) -> None:
        v = loss_check.judge(losses(1, 47, 3.0), losses(1, 50, 3.0), self.steps, 0.10)
        assert not v.passed and "no loss for steps 48-50" in v.reason

    def test_record_mode_passes_on_finite_and_fails_on_nan(self) -> None:
        assert loss_check.judge(losses(1, 50, 3.0), None, self.steps, 0.10).passed
        bad = losses(1, 50, 3.0) | {48: math.nan}
        assert not loss_check.judge(bad, None, self.steps, 0.10).passed


class TestSmoke:
    def result(self, **over: object) -> dict[str, object]:
        base: dict[str, object] = {
            "exit_code": 0, "exit_class": "succeeded", "last_step": 3, "suspects": [],
            "startup": {"ranks": [{"rank": 0}, {"rank": 1}], "allreduce": {"got": 3.0, "expected": 3.0}},
            "metrics": [{"step": s, "loss": 5.0} for s in (1, 2, 3)]}
        base.update(over)
        return base

    def test_all_good_passes(self) -> None:
        v = smoke.judge(self.result(), expected_ranks=2, steps=3)
        assert v.passed and "2/2 ranks reported" in v.reason

    def test_nothing_launched_says_why_not_an_all_reduce_over_0_ranks(self) -> None:
        """Issue 40: with every node excluded the verdict read "all-reduce over 0 ranks
        returned None, expected exactly None"."""
        r = self.result(exit_code=None, exit_class="crashed_systemic", startup=None, metrics=[], run_dir="/w/a",
                        error="too few usable nodes: 2 asked, 1 left (excluded: local-n1)")
        v = smoke.judge(r, expected_ranks=0, steps=3)
        assert not v.passed and v.reason == ("no rank was launched: too few usable nodes: 2 asked, 1 left "
                                             "(excluded: local-n1) (run directory /w/a)")

    def test_missing_rank_fails_naming_it(self) -> None:
        r = self.result(startup={"ranks": [{"rank": 0}], "allreduce": {"got": 3.0, "expected": 3.0}},
                        suspects=[{"node": "n1", "reason": "no heartbeat"}])
        v = smoke.judge(r, expected_ranks=2, steps=3)
        assert not v.passed and "ranks [1]" in v.reason and "n1" in v.reason

    def test_a_missing_file_is_named_with_the_rank_log(self) -> None:
        r = self.result(startup=None, run_dir="/w/smoke/attempt-001", log="/w/smoke/attempt-001/logs/rank-0.log",
                        files={"startup.json": False, "metrics.jsonl": True})
        v = smoke.judge(r, expected_ranks=2, steps=3)
        assert not v.passed and v.reason.endswith(
            "(/w/smoke/attempt-001/startup.json is missing; rank 0's log: /w/smoke/attempt-001/logs/rank-0.log)")
        r = self.result(metrics=[{"step": 1, "loss": 5.0}], run_dir="/w/a", log="/w/a/logs/launcher.log",
                        files={"startup.json": True, "metrics.jsonl": True})
        v = smoke.judge(r, expected_ranks=2, steps=3)
        assert "only 1 of 3 steps" in v.reason and "(/w/a/metrics.jsonl has none; rank 0's log: /w/a/logs/launcher.log)" in v.reason

    def test_wrong_allreduce_sum_fails(self) -> None:
        r = self.result(startup={"ranks": [{"rank": 0}, {"rank": 1}], "allreduce": {"got": 2.0, "expected": 3.0}})
        v = smoke.judge(r, expected_ranks=2, steps=3)
        assert not v.passed and "returned 2.0, expected exactly 3.0" in v.reason

    def test_nonfinite_loss_fails(self) -> None:
        r = self.result(metrics=[{"step": 1, "loss": 5.0}, {"step": 2, "loss": math.inf}, {"step": 3, "loss": 5.0}])
        assert "non-finite loss at step 2" in smoke.judge(r, expected_ranks=2, steps=3).reason

    def test_a_stall_fails_with_suspects(self) -> None:
        r = self.result(exit_code=124, exit_class="stalled", duration_s=300.0,
                        suspects=[{"node": "x1", "reason": "no heartbeat"}])
        v = smoke.judge(r, expected_ranks=2, steps=3)
        assert not v.passed and "stalled after 300 s at step 3" in v.reason and "x1" in v.reason

    def test_a_trainer_that_reported_no_step_is_quoted(self, tmp_path: Path) -> None:
        """Issue 27: an unmodified script that exits 0 before any step says why in its output."""
        log = tmp_path / "rank-0.log"
        log.write_text("x.py:3: UserWarning: something\n  warn()\nUnable to locate sufficient 2 gpus. Exiting.\n"
                       "/t.py:9: FutureWarning: deprecated\n  scaler = 1\n")
        r = self.result(metrics=[], startup=None, last_step=None, progress="stdout", log=str(log))
        v = smoke.judge(r, expected_ranks=2, steps=3, startup_expected=False)
        assert not v.passed and "exited 0 without a line that trainer.step_pattern matches" in v.reason
        assert v.reason.endswith("its last line: 'Unable to locate sufficient 2 gpus. Exiting.'"), v.reason

    def test_a_trainer_counting_from_0_is_detected(self) -> None:
        """Issue 27 item 5: without trainer.first_step: 0, nanoGPT reports steps 0..3 for 3 asked."""
        r = self.result(metrics=[{"step": s, "loss": 5.0} for s in (0, 1, 2, 3)], startup=None, last_step=3)
        v = smoke.judge(r, expected_ranks=2, steps=3, startup_expected=False)
        assert not v.passed and "reported 4 steps for 3 asked: it counts from 0; set trainer.first_step: 0" in v.reason

    def test_the_hard_timeout_is_its_own_class_and_says_so(self) -> None:
        """Issue 27 item 4: exit 124 from the hard timeout is not a stall; never "step None"."""
        r = self.result(exit_code=124, exit_class="timed_out", duration_s=120.0, last_step=None, metrics=[],
                        stall="hard timeout of 120 s (the stage's timeout_s) at step none, 118 s after the last progress")
        for v in (smoke.judge(r, expected_ranks=2, steps=3), smoke.judge(r, expected_ranks=2, steps=3,
                                                                       startup_expected=False)):
            assert not v.passed and "hit the hard timeout after 120 s before its first step; exit 124" in v.reason
            assert "hard timeout of 120 s (the stage's timeout_s)" in v.reason and "None" not in v.reason


class TestScaling:
    stage = scaling.ScalingStage(node_counts=[1, 2, 4], steps=10, warmup_steps=2, min_efficiency=0.8,
                                 loss_tolerance=0.1)

    def rows(self, tps: list[float], loss: list[float]) -> list[dict[str, object]]:
        return [{"nodes": n, "tokens_per_s": t, "loss": lo, "exit_code": 0, "exit_class": "succeeded",
                 "last_step": 10} for n, t, lo in zip([1, 2, 4], tps, loss)]

    def test_efficiency_is_per_node_throughput_vs_smallest(self) -> None:
        v = scaling.judge(self.rows([100, 180, 320], [3.0, 3.0, 3.05]), self.stage, None)
        effs = [r["efficiency"] for r in v.numbers["table"]]
        assert effs == pytest.approx([1.0, 0.9, 0.8])
        assert v.passed, "0.8 exactly is at the floor"

    def test_below_the_floor_fails(self) -> None:
        v = scaling.judge(self.rows([100, 180, 300], [3.0, 3.0, 3.0]), self.stage, None)
        assert not v.passed and "4 node(s): efficiency 0.75 below 0.8" in v.reason

    def test_loss_outside_tolerance_fails(self) -> None:
        v = scaling.judge(self.rows([100, 200, 400], [3.0, 3.0, 3.2]), self.stage, None)
        assert not v.passed and "4 node(s): mean loss over steps 6-10 3.2000 vs reference 3.0000" in v.reason

    def test_the_loss_is_judged_over_a_window_not_one_noisy_step(self) -> None:
        """Issue 14 item 6: a spike at the last step alone does not fail the count; a shifted window does."""
        def metrics(last: float, shift: float = 0.0, nodes: int = 2) -> list[dict[str, object]]:
            tps = 100.0 * nodes
            return [{"step": s, "tokens_per_s": tps, "loss": 3.0 + shift + (0.01 if s % 2 else -0.01)}
                    for s in range(1, 10)] + [{"step": 10, "tokens_per_s": tps, "loss": last + shift}]
        window = scaling.window_steps(self.stage)
        rows = [scaling.measure(metrics(3.0, nodes=1), nodes=1, warmup=2, window=window),
                scaling.measure(metrics(3.3), nodes=2, warmup=2, window=window)]
        for r in rows:
            r.update(exit_code=0, exit_class="succeeded")
        stage = self.stage.model_copy(update={"node_counts": [1, 2]})
        v = scaling.judge(rows, stage, None)
        assert window == [6, 7, 8, 9, 10] and v.passed and "mean loss over steps 6-10 within" in v.reason, v.reason
        rows[1] = {**scaling.measure(metrics(3.0, shift=0.2), nodes=2, warmup=2, window=window), "exit_code": 0}
        assert not scaling.judge(rows, stage, None).passed
        v = scaling.judge(rows[:1], stage.model_copy(update={"node_counts": [1]}), {10: 3.0})
        assert not v.passed and "the reference has no loss for every one of steps 6-10" in v.reason

    def test_a_count_that_did_not_finish_fails(self) -> None:
        rows = self.rows([100, 200], [3.0, 3.0])
        rows[1].update(exit_code=124, exit_class="stalled", last_step=4)
        v = scaling.judge(rows, self.stage, None)
        assert not v.passed and "2 node(s): exited 124 (stalled) at step 4" in v.reason

    def test_measure_skips_warmup_and_takes_medians(self) -> None:
        metrics = [{"step": s, "step_time_s": 9.0 if s <= 2 else 1.0 + s / 100, "tokens_per_s": 10.0,
                    "comm_time_s": 0.25, "mem_peak_gib": float(s), "loss": 5.0 - s / 10} for s in range(1, 11)]
        row = scaling.measure(metrics, nodes=2, warmup=2)
        assert row["step_time_s"] == pytest.approx(1.065)
        assert row["comm_share"] == pytest.approx(0.25 / 1.065)
        assert row["mem_peak_gib"] == 10.0 and row["last_loss"] == pytest.approx(4.0)

    def test_without_tokens_per_s_the_verdict_says_so_instead_of_crashing(self) -> None:
        """Issue 27 item 1: a trainer read through its output reports no tokens/s; the judge
        formatted None into its summary (TypeError) before it got to say so."""
        rows = self.rows([100, 200, 400], [3.0, 3.0, 3.0])
        for r in rows:
            r.update(tokens_per_s=None, step_time_s=None)
        v = scaling.judge(rows, self.stage, None)
        assert not v.passed and "1 node(s): no tokens/s reported and no step time to derive it from" in v.reason

    def test_tokens_per_s_from_step_times_and_tokens_per_step(self) -> None:
        """Issue 27 item 1: tokens per step from the rows' cumulative tokens, else from the spec."""
        rows = [{"step": s, "step_time_s": 0.5, "tokens": 256 * s, "loss": 3.0} for s in range(1, 11)]
        assert scaling.measure(rows, nodes=2, warmup=2)["tokens_per_s"] == pytest.approx(512.0)
        bare = [{**r, "tokens": 0} for r in rows]  # the stdout adapter's rows without a tokens group
        assert scaling.measure(bare, nodes=2, warmup=2)["tokens_per_s"] is None
        assert scaling.measure(bare, nodes=2, warmup=2, tokens_per_step=128)["tokens_per_s"] == pytest.approx(256.0)

    def test_strong_scaling_needs_a_divisible_batch(self) -> None:
        assert scaling.strong_micro_batch(8, 1, 4) == 2
        with pytest.raises(ValueError, match="does not split evenly over 3 nodes"):
            scaling.strong_micro_batch(4, 1, 3)


class TestLongRun:
    def attempt(self, code: int, cls: str, steps: range, **over: object) -> dict[str, object]:
        return {"exit_code": code, "exit_class": cls, "last_step": steps[-1] if steps else None,
                "metrics": [{"step": s, "tokens": s * 100, "loss": 2.0} for s in steps], **over}

    def test_reached_after_a_relaunch(self) -> None:
        a = [self.attempt(124, "stalled", range(1, 26), suspects=[{"node": "n1"}]), self.attempt(0, "succeeded", range(21, 41))]
        v = long_run.judge(a, steps=40, tokens=None, excluded=["n1"])
        assert v.passed and "after 1 relaunch(es) (stalled), excluded n1" in v.reason

    def test_a_suspect_that_was_not_excluded_is_not_called_excluded(self) -> None:
        a = [self.attempt(124, "stalled", range(1, 26), suspects=[{"node": "n1"}]), self.attempt(0, "succeeded", range(21, 41))]
        v = long_run.judge(a, steps=40, tokens=None, excluded=[])
        assert v.passed and "excluded n1" not in v.reason and "suspected n1 (none excluded)" in v.reason

    def test_an_attempt_resumed_at_its_target_passes_on_what_the_ledger_carried(self) -> None:
        """A driver died while its trainer reached the target; the orphan's rows were adopted,
        the relaunch loads the final checkpoint and trains no step of its own."""
        v = long_run.judge([self.attempt(0, "succeeded", range(0))], steps=40, tokens=4000,
                           carried={"step": 40, "tokens": 4000, "loss": 1.5})
        assert v.passed and "step 40, 4,000 tokens" in v.reason
        short = long_run.judge([self.attempt(0, "succeeded", range(0))], steps=40, tokens=4000,
                               carried={"step": 30, "tokens": 3000, "loss": 1.5})
        assert not short.passed and "short of the target" in short.reason

    def test_a_step_trained_again_is_quoted_from_the_later_attempt(self) -> None:
        """Issue 39, item 5: the verdict quoted the earlier attempt's loss for the final step
        that a relaunch trained again."""
        first = self.attempt(1, "crashed_unknown", range(1, 15))
        again = self.attempt(0, "succeeded", range(9, 15))
        again["metrics"] = [{**m, "loss": 1.25} for m in again["metrics"]]
        v = long_run.judge([first, again], steps=14, tokens=None)
        assert v.passed and "final loss 1.2500" in v.reason and v.numbers["last_loss"] == 1.25, v.reason

    def test_a_failure_after_rank_0_reported_the_target_is_not_relaunched(self) -> None:
        """Issue 39, item 5: a rank crashed after rank 0 had reported the last step; the relaunch
        redid steps from an older checkpoint. The stage stops there and passes on that
        attempt's own final step and loss, saying how the launch ended."""
        class O:
            def __init__(self, code: int, cls: str, last: int | None) -> None:
                self.exit_code, self.exit_class, self.last_step = code, cls, last
                self.report = type("R", (), {"finding": {}})()

        stage = long_run.LongRunStage(steps=14, max_attempts=3)
        assert long_run.next_action([O(3, "crashed_unknown", 14)], stage, target_step=14) == "target reached"
        assert long_run.next_action([O(3, "crashed_unknown", 13)], stage, target_step=14) is None
        assert long_run.next_action([O(94, "diverged", 14)], stage, target_step=14) == "not resumable"
        a = self.attempt(3, "crashed_unknown", range(1, 15), error="rank 1 on n2 exited with 3; its log (/r/rank-1.log) "
                         "shows no error line. Not enough evidence to blame a node; none blamed, one confirming retry.")
        v = long_run.judge([a], steps=14, tokens=None, stop="target reached")
        assert v.passed and "reached 14 steps (step 14, 1,400 tokens)" in v.reason, v.reason
        assert ("attempt 1 then ended crashed_unknown (exit 3) after its rank 0 reported the last step: rank 1 on n2 "
                "exited with 3; its log (/r/rank-1.log) shows no error line; not relaunched") in v.reason, v.reason
        assert "confirming retry" not in v.reason

    def test_budget_spent(self) -> None:
        a = [self.attempt(1, "crashed_node", range(1, 5))] * 3
        v = long_run.judge(a, steps=40, tokens=None, stop="budget", max_attempts=3)
        assert not v.passed and "attempt budget of 3 spent" in v.reason

    def test_systemic_names_no_node(self) -> None:
        a = [self.attempt(127, "crashed_systemic", range(0))] * 2
        v = long_run.judge(a, steps=40, tokens=None, stop="budget", max_attempts=2)
        assert "systemic (no node blamed, none excluded)" in v.reason

    def test_config_error_is_not_retried(self) -> None:
        v = long_run.judge([self.attempt(93, "config_error", range(0))], steps=40, tokens=None, stop="not resumable")
        assert not v.passed and "not retried" in v.reason

    def test_short_of_token_target_fails(self) -> None:
        v = long_run.judge([self.attempt(0, "succeeded", range(1, 11))], steps=40, tokens=5000)
        assert not v.passed and "short of the target" in v.reason

    def test_crash_loop_detection(self) -> None:
        class O:
            def __init__(self, last: int | None) -> None:
                self.last_step = last

        assert long_run._no_progress([O(30), O(30), O(30), O(30)], 3)
        assert not long_run._no_progress([O(10), O(20), O(30)], 3)
        assert long_run._no_progress([O(None), O(None), O(None)], 3)


class TestResumeTest:
    ref = [{"step": s, "tokens": s * 10, "loss": 5.0 - s / 100} for s in range(1, 17)]

    def resumed(self, shift: float = 0.0, first: int = 11, tokens_off: int = 0) -> dict[str, object]:
        rows = [{"step": s, "tokens": s * 10 + tokens_off, "loss": 5.0 - s / 100 + (shift if s >= 13 else 0.0)}
                for s in range(first, 17)]
        return {"exit_code": 0, "exit_class": "succeeded", "metrics": rows}

    def test_bit_exact_passes(self) -> None:
        c = resume_test.compare("SIGKILL", self.ref, {"exit_code": 137}, self.resumed(), 0.0)
        v = resume_test.judge([c])
        assert v.passed and "resumed from step 10, equal bit for bit" in v.reason

    def test_names_the_first_differing_step(self) -> None:
        c = resume_test.compare("SIGKILL", self.ref, {"exit_code": 137}, self.resumed(shift=1e-7), 0.0)
        v = resume_test.judge([c])
        assert not v.passed and "loss differs first at step 13" in v.reason

    def test_tolerance_admits_small_differences(self) -> None:
        c = resume_test.compare("SIGTERM", self.ref, {"exit_code": 143}, self.resumed(shift=1e-7), 1e-6)
        assert resume_test.judge([c]).passed

    def test_a_resume_from_scratch_is_caught(self) -> None:
        ok = resume_test.compare("SIGKILL", self.ref, {"exit_code": 137}, self.resumed(), 0.0, checkpoint_step=10)
        assert resume_test.judge([ok]).passed
        c = resume_test.compare("SIGKILL", self.ref, {"exit_code": 137}, self.resumed(first=1), 0.0, checkpoint_step=10)
        assert "started at step 1, not after the checkpoint of step 10" in resume_test.judge([c]).reason

    def test_a_difference_says_why_when_the_losses_tell(self) -> None:
        """Issue 27 item 3: nanoGPT reseeds at start: the model is restored (loss near the
        reference's), the batches are not; a run whose first loss is a fresh start's is named too."""
        reseeded = self.resumed()
        reseeded["metrics"] = [{**m, "loss": m["loss"] + 0.003} for m in reseeded["metrics"]]  # type: ignore[attr-defined]
        v = resume_test.judge([resume_test.compare("SIGKILL", self.ref, {"exit_code": 137}, reseeded, 0.0,
                                                   checkpoint_step=10, own_checkpoint=True)])
        assert not v.passed and "loss differs first at step 11" in v.reason
        assert "the model was restored but not the batches" in v.reason and "reseeds its RNG" in v.reason, v.reason
        fresh = self.resumed()
        fresh["metrics"] = [{**m, "loss": 5.0 - (m["step"] - 10) / 100} for m in fresh["metrics"]]  # type: ignore[attr-defined]
        v = resume_test.judge([resume_test.compare("SIGKILL", self.ref, {"exit_code": 137}, fresh, 0.0,
                                                   checkpoint_step=10, own_checkpoint=True)])
        assert "the model state may not have been restored" in v.reason, v.reason
        v = resume_test.judge([resume_test.compare("SIGKILL", self.ref, {"exit_code": 137},
                                                   self.resumed(shift=1e-7), 0.0, checkpoint_step=10)])
        assert "steps 11-12 matched: the state was restored" in v.reason, v.reason

    def test_a_resume_that_repeats_the_interrupted_run_is_not_blamed_for_the_runs_differing(self) -> None:
        """Issue 39, item 5: the interrupted run trained another run than the reference (before:
        max_steps 10^9 changed build-nanogpt's cosine from step 13); the resumed steps equal its
        own logged steps bit for bit, so the verdict says the resume restored that run and the
        two runs differ, instead of blaming "a script that reseeds its RNG"."""
        other = [{**m, "loss": m["loss"] + (0.01 if m["step"] >= 3 else 0.0)} for m in self.ref]  # from step 3
        cut = {"exit_code": 137, "metrics": [m for m in other if m["step"] <= 12]}
        resumed = {"exit_code": 0, "exit_class": "succeeded", "metrics": [m for m in other if m["step"] >= 11]}
        c = resume_test.compare("SIGKILL", self.ref, cut, resumed, 0.0, checkpoint_step=10, own_checkpoint=True)
        v = resume_test.judge([c])
        assert not v.passed and "loss differs first at step 11" in v.reason, v.reason
        assert ("the resumed steps 11-12 equal the interrupted run's own bit for bit: the checkpoint restored that run "
                "exactly; the interrupted run itself differs from the reference from step 3") in v.reason, v.reason
        assert "reseeds" not in v.reason and c["cut_max_abs_diff"] == 0 and c["cut_first_differing_step"] is None

    def test_the_resumed_steps_are_compared_with_the_interrupted_runs_own(self) -> None:
        cut = {"exit_code": 137, "metrics": [m for m in self.ref if m["step"] <= 12]}
        v = resume_test.judge([resume_test.compare("SIGKILL", self.ref, cut, self.resumed(), 0.0, checkpoint_step=10)])
        assert v.passed and "equal bit for bit (the interrupted run's own steps 11-12: bit for bit)" in v.reason, v.reason
        reseeded = self.resumed()
        reseeded["metrics"] = [{**m, "loss": m["loss"] + 0.003} for m in reseeded["metrics"]]  # type: ignore[attr-defined]
        v = resume_test.judge([resume_test.compare("SIGKILL", self.ref, cut, reseeded, 0.0, checkpoint_step=10,
                                                   own_checkpoint=True)])
        assert "the resumed step 11 differs from the interrupted run's own too (4.893 vs 4.89)" in v.reason, v.reason
        assert "reseeds its RNG" in v.reason

    def test_token_gap_is_caught(self) -> None:
        c = resume_test.compare("SIGKILL", self.ref, {"exit_code": 137}, self.resumed(tokens_off=10), 0.0)
        assert "tokens do not continue" in resume_test.judge([c]).reason
