"""The study file's two forms: servetune's own (``servetune.py``) and TorchServe's auto-benchmark model config
(``torchserve.py``). Each reads YAML into a :class:`~servetune.tune.study.Study`; ``loader.py`` picks the form."""
