"""Per-model statistics: an answered request counts as its first response plus a success."""

from naiad.observability.statistics import ModelStatistics


def test_answered_request_counts_like_first_response_and_success():
    combined = ModelStatistics("m", "1", (1.0, 10.0), ((0.5, 0.05),))
    separate = ModelStatistics("m", "1", (1.0, 10.0), ((0.5, 0.05),))
    for duration_ns, queue_ns in ((400_000, 1_000), (5_000_000, 2_000), (50_000_000, 0)):
        combined.record_answered(duration_ns, queue_ns)
        separate.record_first_response(duration_ns)
        separate.record_request(True, duration_ns, queue_ns)
    combined.record_execution(4, 2, 10, 100, 20)
    separate.record_execution(4, 2, 10, 100, 20)
    assert combined.first_response_histogram() == separate.first_response_histogram() == (
        [(1.0, 1), (10.0, 2), (float("inf"), 3)], 55.4, 3)
    mine, theirs = combined.as_dict(), separate.as_dict()
    assert mine.pop("last_inference") > 0 and theirs.pop("last_inference") > 0
    assert mine == theirs
    stats = mine["inference_stats"]
    assert stats["success"] == {"count": 3, "ns": 55_400_000} and stats["queue"] == {"count": 3, "ns": 3_000}
    assert stats["compute_infer"] == {"count": 2, "ns": 200} and stats["fail"] == {"count": 0, "ns": 0}
    assert mine["batch_stats"] == [{"batch_size": 4, "compute_input": {"count": 1, "ns": 10},
                                    "compute_infer": {"count": 1, "ns": 100}, "compute_output": {"count": 1, "ns": 20}}]
    assert combined.summaries is not None and separate.summaries is not None
    for key in ("request", "queue", "compute_infer"):
        assert combined.summaries.snapshot(key) == separate.summaries.snapshot(key)
    assert combined.summaries.snapshot("request")[1:] == (55_400, 3)  # sum in us, count


def test_executions_without_input_or_output_time_keep_every_compute_sum_and_count_exact():
    """A Python model's executions time only the whole execute (input and output 0); mixed with fully timed
    ones, the three compute durations still count every request and sum every duration."""
    stats = ModelStatistics("m", "1")
    stats.record_execution(1, 1, 0, 500, 0)
    stats.record_execution(4, 2, 10, 100, 20)
    stats.record_execution(1, 1, 0, 700, 0)
    snapshot = stats.as_dict()
    inference = snapshot["inference_stats"]
    assert list(inference) == ["success", "fail", "queue", "compute_input", "compute_infer", "compute_output",
                               "cache_hit", "cache_miss"]
    assert inference["compute_input"] == {"count": 4, "ns": 20}
    assert inference["compute_infer"] == {"count": 4, "ns": 1_400}
    assert inference["compute_output"] == {"count": 4, "ns": 40}
    assert snapshot["execution_count"] == 3 and snapshot["inference_count"] == 6
    assert snapshot["batch_stats"] == [
        {"batch_size": 1, "compute_input": {"count": 2, "ns": 0}, "compute_infer": {"count": 2, "ns": 1_200},
         "compute_output": {"count": 2, "ns": 0}},
        {"batch_size": 4, "compute_input": {"count": 1, "ns": 10}, "compute_infer": {"count": 1, "ns": 100},
         "compute_output": {"count": 1, "ns": 20}}]
