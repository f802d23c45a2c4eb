"""What the stock baseline models (client/stock_repository) share: loading the Hugging Face
checkpoint their config.pbtxt names, as a Triton user's plain model.py would."""
from __future__ import annotations

import json


def load_checkpoint_model(args: dict, auto_class):
    """`auto_class.from_pretrained` on the folder in config.pbtxt's `checkpoint` parameter, with
    SDPA attention, fp16 on a GPU (fp32 on the CPU), ready for inference. Returns (model, device)."""
    import torch
    import triton_python_backend_utils as pb_utils

    params = {k: v["string_value"] for k, v in json.loads(args["model_config"]).get("parameters", {}).items()}
    if not params.get("checkpoint"):
        raise pb_utils.TritonModelException(
            f"{args['model_name']}: set the `checkpoint` parameter to a Hugging Face folder")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.float16 if device.type == "cuda" else torch.float32
    model = auto_class.from_pretrained(params["checkpoint"], dtype=dtype, attn_implementation="sdpa")
    return model.to(device).eval(), device
