# python -m contrastive_jax.main --config=configs/default.py --workdir=runs/default
"""Default: CLIP-style two-tower training on the top / bottom halves of the digits.

scikit-learn's 8x8 digits (prepared as the `sklearn_digits` TFDS dataset, no download);
each image gives a pair (top 4 rows, bottom 4 rows); two MLP towers learn to retrieve one
half from the other with the symmetric InfoNCE (CLIP) loss over the global batch, data
parallel over all devices (8 simulated CPU devices when there is no accelerator).
Evaluation: cross-view retrieval on the 360-image test split (chance R@1 = 1/360).
"""

import ml_collections


def get_config() -> ml_collections.ConfigDict:
    """The default configuration, locked; variants import it and override a few fields.

    Locked: setting a field it does not have (a typo) raises, with a "did you mean".
    """
    config = ml_collections.ConfigDict()
    config.seed = 0  # Seeds parameter init and dropout (data order: config.data.seed).
    # CPU only: main.py asks XLA for this many host devices before JAX starts (data
    # parallel on a CPU-only machine); GPUs / TPUs are used as they are.
    config.num_simulated_devices = 8  # Simulated CPU devices; 1: no simulation.

    config.data = data = ml_collections.ConfigDict()
    # The data: a built-in dataset ("sklearn_digits", "cmudict", "shapes": written to
    # records on first use under data_dir), or your own record set (data.records, written by
    # `python -m contrastive_jax.write_records`; docs/own_data.md).
    data.name = "sklearn_digits"  # A built-in dataset (data/settings.py: BUILTIN); ignored with data.records.
    # Several ("data/a,data/b", or a tuple) are mixed by data.mixture_weights (docs/own_data.md);
    # evaluation reads the first's splits.
    data.records = ml_collections.config_dict.placeholder(object)  # A record set's directory; None: data.name.
    data.mixture_weights = ()  # One weight per set of data.records (e.g. 0.7,0.3); (): one set, unweighted.
    # Task "pairs" on captioned images: k rows per image in a batch, each with another of its
    # captions (the image and its augmentation repeated, its `index` the rows' positive id;
    # k divides the global batch). 1: one caption drawn per visit.
    data.captions_per_image = 1  # k.
    data.data_dir = ml_collections.config_dict.placeholder(str)  # Built-in sets' records' dir; None: ~/.cache/
    data.task = "pairs"  # "pairs" (two halves / image-text), "views" (SimCLR), "labeled".
    data.train_split = "train"  # Split used for training ("a+b": both).
    data.train_class_range = ml_collections.config_dict.placeholder(tuple)  # (lo, hi): keep labels in [lo, hi).
    data.seed = 0  # Seeds the data order and augmentations; the stream is a function of it.
    data.image_size = ml_collections.config_dict.placeholder(int)  # Square size images are resized to; None: native.
    # NaFlex (SigLIP 2): each image at its own aspect ratio, as at most this many patches of
    # model.patch_size (data/naflex_images.py), for a released SigLIP 2 NaFlex (model.init_from).
    data.max_num_patches = 0  # The token budget (e.g. 256, 576, 1024); 0: square images (data.image_size).
    data.text_max_length = 64  # Tokens per caption / text (truncated, 0-padded).
    data.tokenizer = "bytes"  # "bytes" (1 + UTF-8 byte), a SentencePiece .model or a tokenizers .json file.
    data.examples_per_class = 4  # Task "labeled": m examples of each class in a batch.
    data.num_workers = 0  # Processes decoding and augmenting batches; 0: two threads of the trainer's process.
    data.prefetch_batches = 2  # Batches prepared ahead of the trainer (per worker).
    data.on_bad_record = "stop"  # A record that cannot be read: "stop" (exit 2, naming it) or "skip" it.
    data.augment = aug = ml_collections.ConfigDict()
    aug.crop_min_area = 1.0  # Random resized crop's minimum area fraction; 1.0: no crop.
    aug.flip = False  # Random horizontal flips (wrong for digits).
    aug.color_jitter = 0.0  # Brightness / contrast jitter strength; 0: off.
    aug.noise_std = 0.05  # Std of additive Gaussian pixel noise (pixels in [0, 1]); 0: off.

    config.model = model = ml_collections.ConfigDict()
    model.encoder_a = "mlp"  # Tower a's encoder: a name in encoders.ENCODERS.
    model.encoder_b = "mlp"  # Tower b's encoder (ignored when tie_towers).
    model.tie_towers = False  # One shared encoder and head for both inputs (SimCLR).
    model.mlp_hidden_dims = (256, 256)  # Hidden widths of the "mlp" encoder.
    model.cnn_features = (32, 64)  # Channels of the "cnn" encoder's conv stages.
    model.encoder_dim = 256  # Output width of the "mlp" / "cnn" / text encoders.
    model.text_num_layers = 4  # Depth of the "text_transformer" encoder.
    model.patch_size = 16  # ViT patch size in pixels (4 suits 32x32 images).
    # Patch dropout (FLIP, Li et al. 2023; open_clip's `patch_dropout`): a ViT tower keeps
    # max(1, int(P * (1 - p))) of its P patches while training, and its class token; never at
    # evaluation, in `trained` or an export. A row's patches: a function of (seed, step, row).
    model.patch_dropout = 0.0  # p, the fraction of patch tokens dropped; 0: none.
    model.patch_dropout_until_step = 0  # Dropped before this step, all kept from it (FLIP's tuning); 0: throughout.
    model.dropout_rate = 0.1  # Dropout in the MLP encoder and transformers.
    model.projection_hidden_dims = ()  # Hidden widths of the projection head; (): linear.
    model.embed_dim = 64  # Width of the L2-normalised embedding the loss sees.
    model.num_classes = 0  # > 0 adds a classifier head (the classifier losses need it).
    model.compute_dtype = "float32"  # "bfloat16": bfloat16 activations, float32 params/loss.
    # What each Transformer block recomputes in the backward pass instead of keeping, the least
    # first: "none"; "attention" (XLA's attention probabilities, [B, heads, L, L] per block);
    # "dots" (keeps the Dense layers' outputs); "full" (keeps each block's input). Or one per run
    # of blocks from the first, each but the last with its count: "full:6,none" (blocks 0-5 full).
    model.remat = "none"  # A setting above (models.transformer.remat_plan).
    model.attention = "auto"  # Attention kernel: "auto" (cuDNN's fused on a GPU in bfloat16), "xla", "cudnn".
    model.init_from = ""  # A released checkpoint to start from (open_clip .safetensors/.bin, SigLIP .npz); "": none.
    model.quick_gelu = False  # Force QuickGELU; else read from the open_clip_config.json beside init_from, or its path.
    # CoCa (Yu et al. 2022; models/coca.py): a ViT encoder_a with attention pooling, the
    # text_transformer as its unimodal text tower, and a multimodal decoder that captions.
    model.decoder_depth = 0  # CoCa's decoder blocks (cross-attending to the image); 0: no decoder (two towers).
    model.coca_queries = 256  # CoCa's pooling queries: the first pools the embedding, the rest feed the decoder.

    config.loss = loss = ml_collections.ConfigDict()
    loss.name = "clip"  # A name in losses.registry.LOSSES (which lists what each reads).
    loss.temperature = 0.07  # Initial (learned) or fixed temperature; 1/temperature <= 100.
    loss.learn_temperature = True  # Learn log(1/temperature) with the model.
    loss.siglip_bias = -10.0  # SigLIP's initial logit bias (loss "siglip" only).
    loss.margin = 0.2  # "contrastive", "triplet", "cosface" (cosine), "arcface" (radians).
    loss.triplet_mining = "batch_all"  # "triplet": "batch_all", "batch_hard" or "semi_hard".
    loss.label_smoothing = 0.0  # "softmax_ce" label smoothing.
    loss.focal_gamma = 2.0  # "focal": focusing parameter gamma >= 0 (0: softmax CE).
    # Softmax / sigmoid losses stream over tiles of chunk_size rows by chunk_size
    # columns: memory O(N * D + chunk^2) instead of O(B * N), the same result. An int
    # must divide N (N / devices with the ring); "auto" picks the largest divisor of
    # the columns up to 512 on CPU (1024 when D > 256) or 2048 on GPU/TPU, dense when
    # they fit in one tile (losses.logit_stats.auto_chunk_size); None: dense [B, N].
    loss.chunk_size = ml_collections.config_dict.placeholder(object)  # int, "auto" or None.
    loss.collective = "all_gather"  # "all_gather" or "ring" (ppermute; never holds all of b).
    # The logits' matmul operands, for the softmax / sigmoid losses and those beyond the
    # batch: "bfloat16" is mixed precision (float32 accumulation, logits and softmax /
    # log-sum-exp; tolerance in tests/losses/test_streaming.py).
    loss.matmul_dtype = ml_collections.config_dict.placeholder(str)  # None: the embeddings' (float32).
    # How the streamed CLIP, InfoNCE and SigLIP sweep their tiles (losses.Streaming.kernel):
    # "pallas" runs fused Pallas kernels on GPU/TPU (XLA's path on CPU), chunk_size their block.
    loss.kernel = "xla"  # "xla", "pallas" or "pallas_interpret" (Pallas's interpret mode, slow).
    # Negatives beyond the batch (losses.beyond_batch, losses.memory).
    loss.dcl_weight_sigma = ml_collections.config_dict.placeholder(float)  # "dcl": None: DCL; sigma (0.5): DCLW.
    loss.dcl_weight_gradient = False  # "dcl", DCLW: True: the weight's gradient flows (the reference code's form).
    loss.sogclr_gamma = 0.9  # "sogclr": moving-average rate of u, in (0, 1] (1 on a first visit).
    loss.sogclr_table_size = 0  # "sogclr": rows of the u table; 0: the training split's size.
    loss.queue_size = 65536  # "moco_queue": K queued keys per tower, a multiple of N; 0: the batch's keys.
    loss.queue_momentum = 0.0  # "moco_queue": 0: keys from the current encoder; m: its EMA.
    loss.queue_stop_gradient = False  # "moco_queue": True: the current encoder's keys get no gradient.
    loss.xbm_loss = "multi_similarity"  # "xbm": the base loss, one of losses.XBM_LOSSES.
    loss.xbm_memory_size = 4096  # "xbm": M remembered embeddings, a multiple of N.
    loss.xbm_warmup_steps = 0  # "xbm": steps before the memory joins the candidates.
    # "xbm": None: batch and memory pooled in one loss; lambda (1.0 in the paper's code):
    # loss(batch) + lambda loss(batch vs memory), the batch enqueued first.
    loss.xbm_memory_weight = ml_collections.config_dict.placeholder(float)  # None or lambda >= 0.
    # Whom each row is compared with ("clip", "infonce", "siglip"; losses.Candidates, docs/losses.md).
    # The pairs sharing an `index` (an image's captions, data.captions_per_image) as positives of
    # each other: "mean_log_prob" (SupCon's mean form; SigLIP labels them +1) or "log_sum" (MIL-NCE).
    loss.positives = "own"  # "own": each row's own pair only.
    # Each row's softmax within its group of K consecutive rows of the global batch (K divides N).
    loss.group_size = 0  # K: the negatives fixed while N grows; 0: the whole batch.
    # "clip", "infonce": M more rows a step that are only negatives (embedded without gradient;
    # the stream reads N + M, the optimizer's batch is N); M divides over the devices. 0: none.
    loss.extra_negatives = 0  # M: the negatives grown while N stays.
    # A fixed bank of negatives: a .npy file of [M, D] embeddings (D = model.embed_dim; normalised
    # when read), each a negative of every row (in every group); M divides over the devices.
    loss.negatives_from = ""  # The bank's .npy path; "": none.
    # Terms added to the loss by weight (losses.weighted_terms, docs/recipes.md): the total is
    # contrastive_weight x loss.name's + distill_weight x distillation + caption_weight x captioning.
    loss.contrastive_weight = 1.0  # The weight of loss.name's loss; 0: the added terms alone.
    # Distillation from a frozen teacher, embedded in the same step without gradient: a released
    # checkpoint (as model.init_from takes) or a trained run's workdir (its latest checkpoint).
    loss.teacher = ""  # The teacher's path; "": none.
    loss.distill_weight = 0.0  # The distillation's weight; 0: none (> 0 needs loss.teacher).
    # "logits": the student's softmaxes over the global batch matched to the teacher's, rows and
    # columns (open_clip's DistillClipLoss; streamed like loss.name's); "mse" or "cosine": each
    # embedding to the teacher's (through a learned projection where the widths differ).
    loss.distill_form = "logits"  # "logits", "mse" or "cosine".
    loss.caption_weight = 0.0  # CoCa's next-token cross-entropy (a model with a text decoder); 0: none.

    config.optim = optim = ml_collections.ConfigDict()
    optim.name = "adamw"  # "adamw", "lamb", "lars" or "sgd".
    optim.learning_rate = 3e-3  # Peak learning rate (after warmup).
    optim.warmup_steps = 100  # Linear warmup from 0 to the peak.
    # The rate at a global batch N of train.batch_schedule, relative to its first N_0:
    # "linear" x N / N_0, "sqrt" x sqrt(N / N_0), "none" the same; the warmup counts steps.
    optim.lr_scaling = "none"  # "none", "linear" or "sqrt".
    optim.schedule = "cosine"  # After the warmup: "cosine" (decays to the end) or "constant" (the peak for good).
    optim.end_learning_rate_factor = 0.0  # Cosine decays to this fraction of the peak.
    optim.weight_decay = 1e-4  # Decoupled weight decay (not on biases, norms, temperature).
    optim.momentum = 0.9  # "sgd" / "lars" momentum; "adamw" / "lamb" b1.
    optim.grad_clip_norm = 1.0  # Clip the global gradient norm to this; 0: no clipping.
    optim.frozen_tower = ""  # "a" or "b": that tower's parameters are not trained (LiT: "a"); "": both are.
    optim.layer_decay = 1.0  # Layer-wise learning-rate decay: block i of a depth-L tower gets decay**(L + 1 - i).

    # The devices form a (data, fsdp) mesh; the batch is split over both axes. fsdp > 1
    # also splits the parameters and optimizer state (fully sharded data parallel): each
    # device holds 1/fsdp of every array of at least fsdp_min_kib, and XLA gathers a
    # layer's weights where they are used.
    config.mesh = mesh = ml_collections.ConfigDict()
    mesh.fsdp = 1  # Devices splitting the parameters (a divisor of the device count); 1: replicated.
    mesh.fsdp_min_kib = 64.0  # Smaller arrays (biases, norms) stay replicated.

    config.train = train = ml_collections.ConfigDict()
    train.global_batch_size = 256  # Examples per step over all devices (N); a schedule's first stage.
    # The global batch as a schedule (training/batch_schedule.py; docs/training.md):
    # "constant"; stages "512@0,2048@300" (N for the steps after step s, the first
    # N@0 = global_batch_size); "noise": every batch_noise_window_steps steps, double N
    # when the noise scale B_simple over those steps > batch_noise_factor x N, up to
    # batch_max (needs log_noise_scale). The stream counts examples: none repeated or skipped.
    train.batch_schedule = "constant"  # "constant", "N@s,N@s,..." or "noise".
    train.batch_noise_factor = 2.0  # "noise": double N when B_simple > this x N.
    train.batch_noise_window_steps = 50  # "noise": steps whose noise scale one decision reads.
    train.batch_max = 4096  # "noise": the largest global batch (checked to fit before step 1).
    train.num_train_steps = 1000  # Optimizer steps.
    train.log_every_steps = 50  # Metrics to TensorBoard / metrics.jsonl every k steps.
    # Micro-batches hold one micro-batch's activations at a time. "grad_cache": the exact
    # full-batch loss and gradient (GradCache); "accumulate": the mean of the
    # micro-batches' own losses (each sees m - 1 negatives, not N - 1).
    train.micro_batch_size = 0  # Examples per micro-batch (all devices); 0: no micro-batches.
    train.micro_batch_method = "grad_cache"  # "grad_cache" or "accumulate".
    # The gradient noise scale B_simple (McCandlish et al. 2018; noise_scale): each step
    # also takes the norm of every device's share of the gradient; logged as
    # train/noise_scale. Needs >= 2 devices, no micro-batches and a loss without state.
    train.log_noise_scale = False  # Log B_simple every log_every_steps.
    # Before the first step the compiled step's memory per device is checked against this
    # (GiB); None: the accelerator's limit, or on CPU the host's available memory / devices.
    train.memory_limit_gib = ml_collections.config_dict.placeholder(float)  # GiB per device, or None.
    # A bad loss: non-finite, or a spike (> loss_spike_factor x the running median).
    # "stop": exit 1 naming the last good checkpoint; "rollback": restore the newest
    # checkpoint, skip the batches of the next rollback_skip_batches steps (at least
    # through the bad one; recorded in <workdir>/rollbacks.json) and go on (training/loss_guard.py).
    train.on_bad_loss = "stop"  # "stop" or "rollback".
    train.loss_spike_factor = 0.0  # k > 1: a loss above k x the running median is bad; 0: off.
    train.loss_spike_window_steps = 100  # The running median's window, in steps.
    train.rollback_skip_batches = 20  # Batches skipped per rollback (S).
    train.max_rollbacks = 3  # Stop (exit 1) at a bad loss after this many rollbacks (R) ...
    train.rollback_window_steps = 1000  # ... within this many steps (W).
    # Fault injection for tests and drills: these batches' float inputs become NaN
    # (batch t: what step t reads when nothing was skipped). (): none.
    train.inject_nan_at_batches = ()  # Batch numbers to poison; (): none.

    config.eval = ev = ml_collections.ConfigDict()
    ev.split = "test"  # Split evaluated (queries and gallery).
    ev.class_range = ml_collections.config_dict.placeholder(tuple)  # (lo, hi): keep labels in [lo, hi).
    ev.every_steps = 500  # Evaluate every k steps (and at the end); 0: only at the end.
    ev.batch_size = 512  # Examples embedded per forward pass.
    ev.recall_ks = (1, 5, 10)  # K of Recall@K.
    ev.knn_k = 1  # Neighbours of the kNN classifier (train split as memory bank).
    ev.linear_probe = True  # Fit a logistic regression on frozen train embeddings.

    config.checkpoint = ckpt = ml_collections.ConfigDict()
    ckpt.every_steps = 500  # Save every k steps and at the end.
    ckpt.max_to_keep = 3  # Keep the last k checkpoints.
    config.lock()
    return config
