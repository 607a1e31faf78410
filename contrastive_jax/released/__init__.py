"""Released CLIP and SigLIP checkpoints as starting points: open_clip's `state_dict` layout
(OpenAI CLIP's names; `.safetensors`, or `.bin`/`.pt` with torch) and big_vision's SigLIP /
SigLIP 2 `.npz` layout, loaded into Flax towers with the project's model contract.

Each layout module (`open_clip_layout`, `big_vision_layout`) gives:

* `read(path) -> dict[str, np.ndarray]`: the checkpoint's arrays by their own names;
* `settings_from(arrays) -> Settings`: the architecture, inferred from the arrays' shapes;
* `Model(settings)`: a Flax module with `models.TwoTower`'s contract -- `__call__(a, b=None,
  *, train=False)` -> `{"za": [B, D], "zb": [B, D], "temperature": (), "bias": ()}` (bias
  with SigLIP only), `embed(x, side)` -> `[B, D]`; `a` images [B, H, W, 3] uint8 or float in
  [0, 1] (normalized inside as the released model was trained), `b` int32 token ids [B, L];
  embeddings L2-normalized float32; the image tower's parameters under `img`, the text
  tower's under `txt`, `log_inv_temperature` (CLIP's `logit_scale`, SigLIP's `t`) and
  `logit_bias` (SigLIP's `b`) at the top;
* `params_from(arrays, settings)`: the parameter tree of `Model(settings)`.
"""
