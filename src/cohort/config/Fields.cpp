// Over 300 lines on purpose: the declarative table of every key with its help, choices and check, in one
// place to read them all (what --help and docs/cli.md print). Config.cpp parses values, TOML files and
// overrides against it; what combinations are refused is Validate.cpp's.
#include "cohort/config/Fields.h"

namespace cohort::config::detail {

const std::vector<Field>& fields() {
  using T = TrainConfig;
  static const std::vector<Field> all = {
      field("model.name", &T::model, &ModelConfig::name,
            "architecture: CIFAR-style 6n+2 ResNets (resnet8..32), torchvision's ImageNet ResNets (resnet18/34/50; "
            "torchvision's parameter names), ViT-B/32 (vit_b32; timm's names), airbench94 (airbench), or an MLP",
            {"resnet8", "resnet14", "resnet20", "resnet32", "resnet18", "resnet34", "resnet50", "vit_b32", "airbench",
             "mlp"}),
      field("model.width", &T::model, &ModelConfig::width,
            "channels of the first stage of resnet8..32 (doubled per stage) or hidden units of the MLP; "
            "resnet18/34/50 keep torchvision's widths",
            {}, positive<int64_t>()),
      field("model.num_classes", &T::model, &ModelConfig::num_classes, "classes of the output layer", {},
            positive<int64_t>()),
      field("model.pretrained", &T::model, &ModelConfig::pretrained,
            "initial weights from a .safetensors file (torchvision / timm names), checked name by name and "
            "shape by shape; a classifier head of another class count is replaced (fine-tuning)"),
      field("data.name", &T::data, &DataConfig::name,
            "dataset: fashion-mnist or mnist (IDX files), cifar10 (the binary .bin batches), imagefolder "
            "(data.root/train/<class>/*.JPEG and data.root/val/<class>/*.JPEG, classes sorted by name)",
            {"fashion-mnist", "mnist", "cifar10", "imagefolder"}),
      field("data.root", &T::data, &DataConfig::root, "directory holding the dataset files"),
      field("data.batch_size", &T::data, &DataConfig::batch_size,
            "batch size per worker; the global batch is this x world size", {}, positive<int64_t>()),
      field("data.augment", &T::data, &DataConfig::augment,
            "random crop with zero padding + horizontal flip on training images"),
      field("data.crop_padding", &T::data, &DataConfig::crop_padding,
            "padding of the random crop, pixels (0: no crop, flips only; the 3-epoch default job is more accurate "
            "without crops)",
            {}, non_negative<int64_t>()),
      field("data.flip", &T::data, &DataConfig::flip,
            "horizontal flips of training images: random (p = 0.5 each time) or alternating (airbench: a fixed "
            "random half flipped in even epochs, the other half in odd ones; in-memory datasets)",
            {"random", "alternating"}),
      field("data.image_size", &T::data, &DataConfig::image_size,
            "pixels of the images the model sees (0: the dataset's own, 224 for imagefolder); imagefolder: "
            "the RandomResizedCrop size and the validation center crop after resizing the shorter side to "
            "image_size x 256 / 224; other datasets: a bilinear resize",
            {}, non_negative<int64_t>()),
      field("data.workers", &T::data, &DataConfig::workers,
            "imagefolder: decoding threads per worker (0: cores / local workers)", {}, non_negative<int64_t>()),
      field("data.prefetch", &T::data, &DataConfig::prefetch,
            "imagefolder: batches decoded ahead of training, per worker", {}, positive<int64_t>()),
      field("data.on_bad_file", &T::data, &DataConfig::on_bad_file,
            "imagefolder: a corrupt or non-JPEG file is skipped and named in the log (skip), or an error (fail)",
            {"skip", "fail"}),
      field("data.device_resident", &T::data, &DataConfig::device_resident,
            "keep the whole in-memory dataset (fashion-mnist, mnist, cifar10) on the training device and "
            "gather, augment and normalize batches there: no pixels copied per step; the host path's numbers "
            "(up to float rounding when a GPU also resizes, data.image_size)"),
      field("data.train_limit", &T::data, &DataConfig::train_limit, "use only the first N training images (0: all)", {},
            non_negative<int64_t>()),
      field("data.test_limit", &T::data, &DataConfig::test_limit, "use only the first N test images (0: all)", {},
            non_negative<int64_t>()),
      field("train.epochs", &T::train, &TrainLoopConfig::epochs,
            "passes over the training set; a fraction ends the last pass early (2.5: two passes and half of a "
            "third, as Hugging Face Trainer's num_train_epochs), and the schedule spans the steps it makes",
            {}, Check<double>([](const double& v) {
              // A bound, so that epochs x steps per epoch always fits the step counter.
              return v > 0 && v <= 1e6 ? std::string() : std::string("must be > 0 and at most 1000000");
            })),
      field("train.max_steps", &T::train, &TrainLoopConfig::max_steps,
            "stop after this many optimizer steps (0: no limit); the schedule still spans train.epochs", {},
            non_negative<int64_t>()),
      field("train.seed", &T::train, &TrainLoopConfig::seed, "seed of initialization, shuffling and augmentation"),
      field("train.lookahead", &T::train, &TrainLoopConfig::lookahead,
            "airbench's lookahead: every 5 steps pull the weights to their moving average (decay 0.95^5 x "
            "progress^3), and end on the average"),
      field("train.whiten_bias_epochs", &T::train, &TrainLoopConfig::whiten_bias_epochs,
            "airbench: train the whitening layer's bias for this many epochs, then freeze it (0: never freeze)", {},
            non_negative<int64_t>()),
      field("train.grad_accum_steps", &T::train, &TrainLoopConfig::grad_accum_steps,
            "micro-batches per optimizer step; gradients sync only on the last one", {}, positive<int64_t>()),
      field("train.threads", &T::train, &TrainLoopConfig::threads,
            "intra-op threads per worker (0: cores / local workers, or OMP_NUM_THREADS if set)", {},
            non_negative<int64_t>()),
      field("train.retain_memory", &T::train, &TrainLoopConfig::retain_memory,
            "keep freed memory in the process for reuse (glibc malloc thresholds raised; ~10% faster steps)"),
      field("train.resume", &T::train, &TrainLoopConfig::resume,
            "run directory (or checkpoints directory) to resume from; same as --resume"),
      field("train.device", &T::train, &TrainLoopConfig::device,
            "where the model trains: cuda (GPU local_rank), cpu, or auto (cuda when LibTorch sees a GPU)",
            {"auto", "cpu", "cuda"}),
      auto_bool_field("train.channels_last", &T::train, &TrainLoopConfig::channels_last,
                      "conv nets: keep weights and images in channels-last (NHWC) memory format; auto: on for "
                      "convolutional models on CPU and on GPUs with tensor cores"),
      field("train.cudnn_benchmark", &T::train, &TrainLoopConfig::cudnn_benchmark,
            "cuda: let cuDNN time its convolution algorithms for each shape and keep the fastest"),
      field("optim.name", &T::optim, &OptimConfig::name,
            "optimizer: sgd (momentum, Nesterov) or adamw (decoupled weight decay, torch.optim.AdamW)",
            {"sgd", "adamw"}),
      field("optim.lr", &T::optim, &OptimConfig::lr, "peak learning rate", {}, positive<double>()),
      field("optim.momentum", &T::optim, &OptimConfig::momentum, "SGD momentum", {}, in_range(0, 1)),
      field("optim.nesterov", &T::optim, &OptimConfig::nesterov, "Nesterov momentum"),
      field("optim.weight_decay", &T::optim, &OptimConfig::weight_decay, "L2 weight decay", {}, non_negative<double>()),
      field("optim.decay_norm_and_bias", &T::optim, &OptimConfig::decay_norm_and_bias,
            "also decay batch-norm weights and all biases (off: as the ResNet training recipes do)"),
      field("optim.scale_lr", &T::optim, &OptimConfig::scale_lr,
            "linear scaling rule: lr x global batch / optim.base_batch"),
      field("optim.base_batch", &T::optim, &OptimConfig::base_batch, "reference batch of the scaling rule", {},
            positive<int64_t>()),
      field("optim.beta1", &T::optim, &OptimConfig::beta1, "adamw: first-moment decay", {}, in_range(0, 1)),
      field("optim.beta2", &T::optim, &OptimConfig::beta2, "adamw: second-moment decay", {}, in_range(0, 1)),
      field("optim.eps", &T::optim, &OptimConfig::eps, "adamw: denominator epsilon", {}, positive<double>()),
      field("optim.in_backward", &T::optim, &OptimConfig::in_backward,
            "step each gradient bucket's parameters (ddp) or each unit's slice (zero1, zero2, fsdp) as soon as "
            "its reduction ends, while backward goes on (PyTorch DDP's fused optimizer); not with clip_grad_norm "
            "or fp16 loss scaling"),
      auto_bool_field("optim.foreach", &T::optim, &OptimConfig::foreach,
                      "multi-tensor updates: one call per operation per parameter group (torch.optim's foreach); "
                      "auto: on for parameters on CUDA, off on CPU (docs/optimizer.md)"),
      field("optim.clip_grad_norm", &T::optim, &OptimConfig::clip_grad_norm,
            "clip gradients to this global L2 norm, computed across all shards (0: no clipping)", {},
            non_negative<double>()),
      field("optim.norm_lr_scale", &T::optim, &OptimConfig::norm_lr_scale,
            "learning rate x this (and weight decay / this) for parameters named *norm* (airbench: 64)", {},
            positive<double>()),
      field("sched.name", &T::sched, &SchedConfig::name, "learning-rate schedule",
            {"onecycle", "cosine", "step", "constant"}),
      field("sched.warmup_epochs", &T::sched, &SchedConfig::warmup_epochs,
            "linear warmup (cosine, step, constant); onecycle warms up over sched.pct_start", {},
            non_negative<double>()),
      field("sched.warmup_start_factor", &T::sched, &SchedConfig::warmup_start_factor, "warmup starts at lr x this", {},
            in_range(0, 1)),
      field("sched.pct_start", &T::sched, &SchedConfig::pct_start, "onecycle: fraction spent increasing", {},
            in_range(0, 1)),
      field("sched.div_factor", &T::sched, &SchedConfig::div_factor, "onecycle: initial lr = lr / this", {},
            positive<double>()),
      field("sched.final_div_factor", &T::sched, &SchedConfig::final_div_factor,
            "onecycle: final lr = initial lr / this", {}, positive<double>()),
      field("sched.cycle_momentum", &T::sched, &SchedConfig::cycle_momentum,
            "onecycle: momentum (adamw: beta1) from sched.max_momentum down to sched.base_momentum while the lr "
            "rises and back while it falls, as PyTorch's OneCycleLR (its default; not cohort's, see "
            "docs/default-job.md); "
            "optim.momentum and optim.beta1 are then unused"),
      field("sched.base_momentum", &T::sched, &SchedConfig::base_momentum,
            "onecycle with cycle_momentum: the momentum at the peak lr", {}, in_range(0, 1)),
      field("sched.max_momentum", &T::sched, &SchedConfig::max_momentum,
            "onecycle with cycle_momentum: the momentum at the start and the end", {}, in_range(0, 1)),
      field("sched.step_epochs", &T::sched, &SchedConfig::step_epochs, "step: decay every this many epochs", {},
            positive<double>()),
      field("sched.gamma", &T::sched, &SchedConfig::gamma, "step: decay factor", {}, positive<double>()),
      field("sched.min_lr_factor", &T::sched, &SchedConfig::min_lr_factor, "cosine: final lr = lr x this", {},
            in_range(0, 1)),
      field("loss.label_smoothing", &T::loss, &LossConfig::label_smoothing, "label smoothing of the loss", {},
            in_range(0, 1)),
      field("dist.strategy", &T::dist, &DistConfig::strategy,
            "data parallelism: ddp (full replicas), zero1 (optimizer state sharded), zero2 (+ gradients "
            "sharded), fsdp (+ parameters sharded, gathered per unit), swarm (peers that join and leave, no master: "
            "swarm.*), diloco (local steps, then an outer step on the peers' averaged change: diloco.*, over the "
            "swarm)",
            {"ddp", "zero1", "zero2", "fsdp", "swarm", "diloco"}),
      field("dist.fsdp_unit", &T::dist, &DistConfig::fsdp_unit,
            "fsdp: what one gathered unit is: block (a residual or transformer block) or child (a top-level "
            "child module such as layer1)",
            {"block", "child"}),
      field("dist.backend", &T::dist, &DistConfig::backend, "collective engine", {"gloo", "nccl"}),
      field("dist.bucket_mb", &T::dist, &DistConfig::bucket_mb, "gradient bucket size, MiB", {}, positive<double>()),
      field("dist.first_bucket_mb", &T::dist, &DistConfig::first_bucket_mb,
            "first bucket's size, MiB (small, so communication starts early)", {}, positive<double>()),
      field("dist.last_bucket_mb", &T::dist, &DistConfig::last_bucket_mb,
            "last bucket's size, MiB: the first parameters, whose gradients come last (0: dist.first_bucket_mb "
            "under optim.in_backward, whose last bucket's step nothing hides; else no small last bucket)",
            {}, non_negative<double>()),
      field("dist.timeout_s", &T::dist, &DistConfig::timeout_s,
            "seconds a collective or rendezvous may wait before failing", {}, positive<double>()),
      field("dist.overlap", &T::dist, &DistConfig::overlap,
            "all-reduce buckets while backward runs (off: after backward, for comparison)"),
      field("dist.find_unused_parameters", &T::dist, &DistConfig::find_unused_parameters,
            "allow parameters that get no gradient (reduced as zeros); off: an error names them"),
      field("dist.broadcast_buffers", &T::dist, &DistConfig::broadcast_buffers,
            "batch-norm buffers follow rank 0 after every synchronized step"),
      field("dist.debug", &T::dist, &DistConfig::debug,
            "detail: before each collective the ranks compare its kind, dtype and size and name a mismatch "
            "(as TORCH_DISTRIBUTED_DEBUG=DETAIL, which also turns it on); off: no check",
            {"off", "detail"}),
      field("dist.flight_records", &T::dist, &DistConfig::flight_records,
            "how many of its last collectives each rank keeps, and writes to RUN_DIR/flight/ when one fails or "
            "on SIGUSR2, for `cohort doctor` (0: none)",
            {}, non_negative<int64_t>()),
      field("dist.slurm_requeue", &T::dist, &DistConfig::slurm_requeue,
            "under Slurm, after SIGUSR1 (a preemption warning) stopped and saved the run, rank 0 asks Slurm to "
            "requeue the job (scontrol requeue), which then resumes from the save"),
      field("dist.compress", &T::dist, &DistConfig::compress,
            "gradient compression hook: none, fp16 / bf16 (all-reduce in 16 bits) or powersgd",
            {"none", "fp16", "bf16", "powersgd"}),
      field("amp.precision", &T::amp, &AmpConfig::precision,
            "auto (bf16 where the CPU or GPU computes it natively, else fp32 on CPU and fp16-master on older "
            "GPUs, fp16 there with train.lookahead or gradient compression); fp32; bf16 (autocast); fp16 (autocast + "
            "dynamic loss scaling, as torch.cuda.amp or Apex O1); "
            "fp16-master (fp16 weights, fp32 batch norm, fp32 master weights in the optimizer, loss scaling: "
            "Apex O2)",
            {"auto", "fp32", "bf16", "fp16", "fp16-master"}),
      field("amp.init_scale", &T::amp, &AmpConfig::init_scale, "fp16: initial loss scale", {}, positive<double>()),
      field("amp.growth_interval", &T::amp, &AmpConfig::growth_interval,
            "fp16: the loss scale grows after this many steps in a row without inf/NaN gradients", {},
            positive<int64_t>()),
      field("amp.growth_factor", &T::amp, &AmpConfig::growth_factor, "fp16: loss scale x this when it grows", {},
            positive<double>()),
      field("amp.backoff_factor", &T::amp, &AmpConfig::backoff_factor,
            "fp16: loss scale x this after an overflow (the step is skipped on every rank)", {}, in_range(0, 1)),
      field("powersgd.rank", &T::powersgd, &PowerSgdConfig::rank,
            "PowerSGD matrix approximation rank (higher: more exact, more bytes)", {}, positive<int64_t>()),
      field("powersgd.start_iter", &T::powersgd, &PowerSgdConfig::start_iter,
            "plain all-reduce for this many steps before compressing (PyTorch's start_powerSGD_iter)", {},
            non_negative<int64_t>()),
      field("powersgd.min_compression_rate", &T::powersgd, &PowerSgdConfig::min_compression_rate,
            "compress a matrix only where it shrinks at least this much", {}, non_negative<double>()),
      field("powersgd.error_feedback", &T::powersgd, &PowerSgdConfig::error_feedback,
            "carry each step's compression residual into the next step"),
      field("powersgd.warm_start", &T::powersgd, &PowerSgdConfig::warm_start,
            "reuse last step's Q instead of drawing a new random one"),
      field("swarm.listen", &T::swarm, &SwarmConfig::listen,
            "swarm: HOST:PORT where the other peers reach this one (frames over TCP, the DHT over UDP, same port)"),
      field("swarm.initial_peers", &T::swarm, &SwarmConfig::initial_peers,
            "swarm: comma-separated HOST:PORT of any live peers to join through; empty for the first peer"),
      field("swarm.token", &T::swarm, &SwarmConfig::token,
            "swarm: this peer's token file (cohort swarm token --key run.key --ttl 24h --out peer.token)"),
      field("swarm.insecure", &T::swarm, &SwarmConfig::insecure,
            "swarm: no authentication, for a network you trust (Hivemind's default); off: a token is required"),
      field("swarm.target_batch_size", &T::swarm, &SwarmConfig::target_batch_size,
            "swarm: samples the peers accumulate together per optimizer step (the global batch); "
            "0: data.batch_size x swarm.partitions",
            {}, non_negative<int64_t>()),
      field("swarm.matchmaking_s", &T::swarm, &SwarmConfig::matchmaking_s,
            "swarm: seconds a round's leader waits for more ready peers (hivemind.Optimizer's matchmaking_time)", {},
            positive<double>()),
      field("swarm.averaging_timeout_s", &T::swarm, &SwarmConfig::averaging_timeout_s,
            "swarm: seconds an averaging round may take; a peer that has not sent by half of it is left out "
            "(hivemind.Optimizer's averaging_timeout)",
            {}, positive<double>()),
      field("swarm.min_group_size", &T::swarm, &SwarmConfig::min_group_size,
            "swarm: fewest ready peers that average together; fewer: each takes a local step", {}, positive<int64_t>()),
      field("swarm.group_size", &T::swarm, &SwarmConfig::group_size,
            "swarm: at most this many peers average together in a round (more only where a group would otherwise hold "
            "one peer or fewer than swarm.min_group_size); groups change from round to round (a "
            "two-dimensional Moshpit grid: Note [Groups on a grid] in p2p/Matchmaking.cpp) so averages still mix "
            "across the swarm (0: every ready peer, one group; hivemind's target_group_size)",
            {}, non_negative<int64_t>()),
      field("swarm.grid", &T::swarm, &SwarmConfig::grid,
            "swarm with swarm.group_size: dealt (each round's leader deals its members over the next round's keys "
            "and tells every peer) or fixed (at step 2 each peer takes a cell of a grid by its key's rank and keeps "
            "it, as in Moshpit SGD, so no deal is needed and its records go only to the peers that share a "
            "coordinate; a key that grows past a group moves the rest to new keys; the same on every peer)",
            {"dealt", "fixed"}),
      field("swarm.average_state_every", &T::swarm, &SwarmConfig::average_state_every,
            "swarm with swarm.group_size: every N steps the round's group also averages the parameters, which "
            "groups smaller than the swarm would otherwise let drift apart (hivemind.Optimizer's "
            "average_state_every); diloco: every N outer rounds, its outer weights and momentum (0: every step "
            "for swarm, as hivemind's default; every 10 outer rounds for diloco)",
            {}, non_negative<int64_t>()),
      field("swarm.min_peers_to_start", &T::swarm, &SwarmConfig::min_peers_to_start,
            "swarm: the first step waits until this many peers (this one included) are in the swarm, at most "
            "dist.timeout_s (torchrun's minimum of --nnodes=MIN:MAX); later peers join at any time",
            {}, positive<int64_t>()),
      field("swarm.sampler", &T::swarm, &SwarmConfig::sampler,
            "swarm: random (each peer draws from the whole training set with its own seed) or partition (the "
            "shard DistributedSampler gives rank swarm.partition of swarm.partitions, one batch per step: "
            "comparisons with ddp)",
            {"random", "partition"}),
      field("swarm.partitions", &T::swarm, &SwarmConfig::partitions, "swarm.sampler=partition: the number of peers", {},
            positive<int64_t>()),
      field("swarm.partition", &T::swarm, &SwarmConfig::partition,
            "swarm.sampler=partition: this peer's shard, 0 .. swarm.partitions - 1", {}, non_negative<int64_t>()),
      field("swarm.announce_s", &T::swarm, &SwarmConfig::announce_s,
            "swarm: this peer's record goes to the peers it knows at every change, and at least this often to each "
            "that no change reached in the last peer_ttl_s / 2 - this (into the DHT every twice this, every 20 times "
            "this once it knows others)",
            {}, positive<double>()),
      field("swarm.peer_ttl_s", &T::swarm, &SwarmConfig::peer_ttl_s,
            "swarm: a peer whose record is older than this is gone", {}, positive<double>()),
      field("swarm.compress", &T::swarm, &SwarmConfig::compress,
            "swarm: how gradients travel in a round: none (float32), fp16 (half the bytes; "
            "hivemind.Optimizer's grad_compression=Float16Compression()) or int8 (a scale per 1024 values, a "
            "quarter of the bytes; what it loses goes into the next step: error feedback)",
            {"none", "fp16", "int8"}),
      field("diloco.inner_steps", &T::diloco, &DilocoConfig::inner_steps,
            "diloco: local optimizer steps between two outer steps (H in the DiLoCo paper)", {}, positive<int64_t>()),
      field("diloco.outer_lr", &T::diloco, &DilocoConfig::outer_lr, "diloco: the outer Nesterov SGD's learning rate",
            {}, positive<double>()),
      field("diloco.outer_momentum", &T::diloco, &DilocoConfig::outer_momentum,
            "diloco: the outer Nesterov SGD's momentum", {}, in_range(0, 1)),
      field("diloco.compress", &T::diloco, &DilocoConfig::compress,
            "diloco: the pseudo-gradient on the wire: none, fp16, or int8 (a scale per 1024 values, error feedback)",
            {"none", "fp16", "int8"}),
      field("ckpt.every_steps", &T::ckpt, &CkptConfig::every_steps,
            "save checkpoints/last every N steps (0: at the end of every epoch)", {}, non_negative<int64_t>()),
      field("ckpt.keep_last", &T::ckpt, &CkptConfig::keep_last,
            "how many saves of checkpoints/last (step-N directories) to keep; a crash during a save leaves the "
            "previous one",
            {}, positive<int64_t>()),
      field("ckpt.save_best", &T::ckpt, &CkptConfig::save_best, "keep checkpoints/best for the best test accuracy"),
      field("ckpt.upload", &T::ckpt, &CkptConfig::upload,
            "after training, upload checkpoints/best to s3://bucket/prefix/<run name>/ (empty: no upload); "
            "credentials from AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"),
      field("ckpt.upload_best_every_time", &T::ckpt, &CkptConfig::upload_best_every_time,
            "also upload whenever checkpoints/best improves, not only at the end"),
      field("ckpt.s3_endpoint", &T::ckpt, &CkptConfig::s3_endpoint,
            "S3-compatible endpoint URL (empty: AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL or AWS itself); "
            "same as --s3-endpoint"),
      field("eval.tta", &T::eval, &EvalConfig::tta,
            "test-time augmentation: 0 none, 1 average with the flipped image, 2 also 1-pixel translations "
            "(airbench's multi-view TTA)",
            {}, non_negative<int64_t>()),
      field("eval.enabled", &T::eval, &EvalConfig::enabled, "evaluate on the test set after each epoch"),
      field("eval.batch_size", &T::eval, &EvalConfig::batch_size, "evaluation batch size per worker", {},
            positive<int64_t>()),
      field("eval.every_steps", &T::eval, &EvalConfig::every_steps,
            "also evaluate every this many steps, not only after each epoch (0: after each epoch only)", {},
            non_negative<int64_t>()),
      field("log.every_steps", &T::log, &LogConfig::every_steps,
            "steps between progress lines and metrics.jsonl records", {}, positive<int64_t>()),
      field("log.tensorboard", &T::log, &LogConfig::tensorboard,
            "write TensorBoard scalars (events.out.tfevents.*) into the run directory, from rank 0"),
      field("log.monitor_s", &T::log, &LogConfig::monitor_s,
            "seconds between resource samples (RSS, CPU, GPU through NVML) of every rank (0: no monitor)", {},
            non_negative<double>()),
      field("log.progress", &T::log, &LogConfig::progress,
            "rank 0's progress: a live bar on a terminal and plain lines otherwise (auto), or always one of them",
            {"auto", "bar", "plain", "off"}),
      field("log.mlflow", &T::log, &LogConfig::mlflow,
            "MLflow tracking server, http://HOST:PORT: rank 0 logs the config as params, the scalars TensorBoard "
            "gets, the run's files and its status there (empty: no MLflow)"),
      field("log.mlflow_experiment", &T::log, &LogConfig::mlflow_experiment,
            "MLflow experiment of the run (made when missing)"),
      field("log.mlflow_run_name", &T::log, &LogConfig::mlflow_run_name,
            "MLflow run name (empty: the run directory's name)"),
      field("log.mlflow_buffer", &T::log, &LogConfig::mlflow_buffer,
            "metrics kept while the MLflow server does not answer; newer ones are dropped and counted in "
            "summary.json",
            {}, positive<int64_t>()),
      field("log.mlflow_timeout_s", &T::log, &LogConfig::mlflow_timeout_s,
            "seconds one MLflow request may take, and the most the end of a run waits for the server", {},
            positive<double>()),
      field("log.trace_steps", &T::log, &LogConfig::trace_steps,
            "A:B: every rank writes a Chrome trace of steps A to B (phases, collectives) to RUN_DIR/trace/, and "
            "cohort report merges them into RUN_DIR/trace.json for Perfetto or chrome://tracing (empty: none)"),
      field("run.dir", &T::run, &RunConfig::dir, "run directory (empty: runs/<timestamp>); same as --run-dir"),
  };
  return all;
}

}  // namespace cohort::config::detail
