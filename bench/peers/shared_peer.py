"""The team's shared PyTorch peer (../../../shared/peers/torch_ddp_fmnist.py: model, data, recipe), imported
by path for the peers here that build on it, so that each uses it rather than a copy."""
import importlib.util, os

SHARED = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "shared",
                                       "peers", "torch_ddp_fmnist.py"))


def shared_peer():
    spec = importlib.util.spec_from_file_location("torch_ddp_fmnist", SHARED)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
