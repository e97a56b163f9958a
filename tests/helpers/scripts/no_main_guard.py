"""A spawn script WITHOUT the `if __name__ == "__main__":` guard: fabric_lite must say so."""

from fabric_lite import Fabric


def work(fabric):
    return fabric.global_rank


fabric = Fabric(accelerator="cpu", devices=2, strategy="ddp_spawn")
print("LAUNCHER", fabric.launch(work), flush=True)
