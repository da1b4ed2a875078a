"""The root of a run's config (`RunConfig`: the run directory, checkpoints, every table)
and the sections of the run as a whole: evaluation, the runtime and logging. Declares
settings only: knows nothing of what reads them, of the registries, or of torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from reroll.config.generation import (
    EngineConfig,
    ModelConfig,
    RewardConfig,
    RolloutConfig,
    TaskConfig,
)
from reroll.config.ranges import ranged
from reroll.config.training import (
    AlgoConfig,
    ControlConfig,
    LoraConfig,
    ReplayConfig,
    SFTConfig,
    TrainConfig,
)


@dataclass
class EvalConfig:
    n_examples: int = ranged(500, "[0, inf)")
    """Held-out examples used by `reroll eval` and by evaluation during training."""
    k: int = ranged(8, "[1, inf)")
    """pass@k: samples per prompt for the unbiased pass@k estimate (1 disables)."""
    temperature: float = ranged(1.0, "[0, inf)")
    """Temperature of the pass@k samples (greedy accuracy always uses temperature 0)."""
    every: int = ranged(0, "[0, inf)")
    """Evaluate greedy accuracy every this many RL steps during training (0: never; `reroll
    eval` evaluates any checkpoint afterwards)."""
    at_start: bool = True
    """With ``every`` > 0, evaluate once before the first step too (step 0 of the accuracy
    curve). false leaves that evaluation out: row 0 of metrics.jsonl then only marks where the
    training clock starts. For a caller that evaluates the starting checkpoint once itself
    (benchmarks/tournament.py, whose rows all start from one checkpoint)."""
    max_batch: int = ranged(64, "[1, inf)")
    """KV-cache slots of the evaluation's engine: how many held-out requests decode at once.
    The cache is allocated whole (rows x the model's context), so this is memory; as many
    slots as requests (``n_examples``, times ``k`` for the sampled run) start them all at
    once, and the batch then only shrinks as responses end, where fewer slots leave the last
    requests decoding in a thin tail. Rows never attend to each other (per-row masks): the
    count changes when a request decodes, not what it reads."""


@dataclass
class RuntimeConfig:
    kind: str = ranged("local", choices=("local", "ray"))
    """Where services run: local (one process) or ray."""
    max_staleness: int = ranged(0, "[0, inf)")
    """Bound on policy-version lag of trained tokens. 0 is synchronous RL."""
    partial_rollouts: bool = True
    """On a weight update, abort in-flight rollouts, keep their prefix and resume them."""
    overprovision: float = ranged(1.0, "[1, inf)")
    """Start this many times the groups a step needs; unfinished ones carry over (APRIL)."""
    engine_workers: int = ranged(1, "[1, inf)")
    """Engine replicas (Ray runtime)."""
    engine_gpus: float = ranged(0.0, "[0, inf)")
    """Ray runtime: GPUs each engine replica reserves (a fraction shares one, e.g. 0.5).
    > 0: Ray places the replica where that many are free and shows it only those
    (CUDA_VISIBLE_DEVICES), and its model goes on the first (engine.device, else
    model.device, auto or cuda, resolved inside the actor: the driver may have no GPU). A
    whole number above 1 takes whole GPUs; a fraction must fit beside the others on one GPU.
    0: no reservation; replicas go where CPUs are free, see every GPU of their node and take
    their device as the driver resolves it (one machine, all on one device)."""
    trainer_gpus: float = ranged(0.0, "[0, inf)")
    """Ray runtime: GPUs the trainer actor reserves, as runtime.engine_gpus for a replica
    (e.g. 1 with engine_gpus = 1: trainer and engine on separate GPUs). > 0: the driver's
    own copy of the policy for in-loop evaluation goes on its CPU (the GPUs are the
    actors'). A side that reserves nothing takes its device (model.device for the
    trainer, engine.device else model.device for the engines) as the driver resolves it."""
    scoring_workers: int = ranged(0, "[0, inf)")
    """Ray runtime: scoring actors, each running reward.workers verifier processes (on a
    cluster they may sit on other nodes). 0 scores in the driver's own process pool."""
    threads: int = ranged(0, "[0, inf)")
    """torch intra-op threads of each side (the trainer's thread, the engine's thread). 0:
    every core for each side in a synchronous run (max_staleness = 0: the sides take turns,
    so neither leaves a core idle), half of them each in an asynchronous one (both work at
    once; more would oversubscribe the cores)."""
    engine_threads: int = ranged(0, "[0, inf)")
    """torch intra-op threads of the engine's decode thread (the run's engine, its held-out
    evaluations' engines, Ray's engine actors), where that side wants another count than the
    trainer's. 0: runtime.threads' rule. A small model's decode step is too short to split
    across threads, while its training passes are not: a synchronous run of such a model
    goes fastest with the trainer on every core and the engine on one (threads = 0,
    engine_threads = 1)."""
    pin_cores: bool = False
    """Ray runtime on one machine: pin engine replica i to the i-th core the run may use
    and the trainer actor to the core after the replicas (`reroll.runtime.cores`), so the
    two sides never share a core (with runtime.threads = 1 each, as a run with a device a
    side would have); the driver, which steps the engines and scores, shares replica 0's
    core until the run ends. Needs engine_workers + 1 cores, refused at start otherwise."""
    keep_freed_memory: bool = True
    """glibc: keep freed heap memory in the processes that run models (the run's own, Ray's
    trainer and engine actors) instead of handing it back to the OS and faulting it in
    again on the next step (`reroll.memory`); the resident size stays at its peak. Off:
    glibc's own adaptive thresholds."""
    gc_freeze: bool = True
    """Once the run is built (model, engines, Ray actors), exempt every Python object then
    alive from garbage collections until it ends (`gc.freeze`, `reroll.memory`), in
    the driver and in Ray's trainer and engine actors. A full collection otherwise scans
    them all, at a moment the interpreter picks, holding every thread of the process (the
    rollout thread stopped 250 ms at a time on the 2-core box). Off: the interpreter's own
    collections."""
    deterministic: bool = False
    """torch's deterministic kernels in every process that runs a model (the run's own, Ray's
    trainer and engine actors), as TrainingArguments.full_determinism sets them: a fixed
    cuBLAS workspace, cuDNN deterministic and not benchmarking, use_deterministic_algorithms
    (ops without a deterministic CUDA kernel, e.g. the cumsum of top-p sampling, warn
    instead of failing). So that equal GPU runs (resume and uninterrupted, Ray and local)
    agree bit for bit; slower. CPU kernels are deterministic already."""


@dataclass
class LogConfig:
    wandb: bool = False
    """Also send every metrics row to Weights & Biases, beside metrics.jsonl and TensorBoard
    (`pip install reroll[wandb]`). One W&B run per run directory (its id kept in
    RUN/wandb_id), so `--resume` continues it."""
    wandb_project: str = "reroll"
    """W&B project of the run."""
    wandb_mode: str = ranged("offline", choices=("online", "offline", "disabled"))
    """online (streams to the W&B server; needs `wandb login`), offline (writes RUN/wandb;
    upload later with `wandb sync`) or disabled."""
    timeline: bool = False
    """Write RUN/timeline.json: when the trainer waited, trained and published, when the
    engine swapped weights and decoded (how many steps, how many sequences), thread by thread,
    in the Chrome trace-event format (open it in https://ui.perfetto.dev). Written when the
    run ends (also when it fails); never over an earlier one: the next is RUN/timeline.2.json,
    and so on (a resumed run's, say). The driver's threads only (under Ray, the actors'
    work shows as the calls the driver waits on)."""


@dataclass
class RunConfig:
    out_dir: str = "runs/default"
    """Run directory: resolved config, metrics.jsonl, TensorBoard events, checkpoints."""
    init: str = ""
    """Checkpoint directory to start from (e.g. the output of `reroll sft`). Empty: model."""
    plugins: list[str] = field(default_factory=list)
    """Modules of your own imported before the config is checked (`reroll.plugins`), so the
    environments, verifiers, tasks and workflows they register can be named here; the
    scoring workers and Ray actors import them too. Found from the working directory or
    PYTHONPATH, e.g. ``plugins = ["my_components"]``."""
    preset: str = ""
    """Algorithm preset from configs/presets (grpo, dapo, ...); the file's own keys win."""
    log_every: int = ranged(10, "[1, inf)")
    """Steps between rows of metrics.jsonl / TensorBoard (the progress bar updates every step)."""
    ckpt_every: int = ranged(100, "[1, inf)")
    """Steps between checkpoints (the last step is always saved)."""
    record_every: int = ranged(1, "[0, inf)")
    """Record the groups consumed by every this-many-th step in the rollout store
    (RUN/rollouts/, one Parquet file per step; 0: never). `reroll replay` needs every step
    (1); a step of 128 short samples takes about 20 KB."""
    model: ModelConfig = field(default_factory=ModelConfig)
    task: TaskConfig = field(default_factory=TaskConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    control: ControlConfig = field(default_factory=ControlConfig)
    replay: ReplayConfig = field(default_factory=ReplayConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    sft: SFTConfig = field(default_factory=SFTConfig)
    lora: LoraConfig = field(default_factory=LoraConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
    log: LogConfig = field(default_factory=LogConfig)
