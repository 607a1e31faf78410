"""A training run: the config read once into a `run_plan.RunPlan` (`run_plan`, its checks
in `config_checks`) around the step (`trainer`), the optimizer, the loop (`loop`; from a
config, `run_plan.train_and_evaluate`), checkpoints and resuming, the bad-loss guard and
rollback (`loss_guard`), the memory check before step 1 (`memory_fit`), gradient caching,
multi-process start-up (`distributed`), the metrics written (`metric_writer`) and the
gradient noise scale (`noise_scale`).
"""
