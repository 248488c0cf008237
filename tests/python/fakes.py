"""Stand-ins for CUDA arrays on a machine without a GPU: objects that export
__cuda_array_interface__ (version 3) with an address MACO never dereferences because the
argument checks or the 'no GPU' answer come first."""


class FakeCudaArray:
    def __init__(self, shape, typestr="<f4", strides=None, address=0x7F0000000000,
                 readonly=False):
        self.__cuda_array_interface__ = {
            "shape": tuple(shape),
            "typestr": typestr,
            "data": (address, readonly),
            "strides": strides,
            "version": 3,
        }


class FakeCudaTensor:
    """A stand-in for a torch CUDA tensor in the maco process group's device binding: only
    ``device`` (torch.device("cuda", index)) and ``is_cuda`` are read before the binding
    check raises or a test stops."""

    def __init__(self, index):
        import torch

        self.device = torch.device("cuda", index)
        self.is_cuda = True
