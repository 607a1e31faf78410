"""experiments/bench/bench_input.py's mixed-source case: the rates of one record set and of
a mixture of it and its copy, on a tiny set (no timing asserted), and its report."""

from experiments.bench import bench_input


def test_mixture_rates_read_both_streams_and_report_their_ratio(tmp_path):
    jpegs = bench_input.source_jpegs(4)
    per = sum(map(len, jpegs)) / len(jpegs)
    (tmp_path / "records").mkdir()
    records_dir = bench_input.repeated_record_set(jpegs, tmp_path / "records", 100 * per / 2**30)  # ~100 records
    row = bench_input.mixture_rates(records_dir, 32, num_batches=1, workers=0, rounds=1)
    assert row["pipeline"] > 0 and row["mixed"] > 0
    assert row["mixed_over_single"] == row["mixed"] / row["pipeline"]
    results = {
        "machine": {"cpus": 2, "load_before": (0.5, 0, 0)},
        "source": {"images": 4, "mean_kib": per / 1024, "batch": bench_input.BATCH},
        "throughput": {"32px": row},
        "writer_images_per_second": 1.0,
    }
    assert f"| 32px | {row['pipeline']:.0f} | {row['mixed']:.0f} | {row['mixed_over_single']:.2f} |" in (
        bench_input.report(results)
    )
