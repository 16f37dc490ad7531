"""Registration of flashgla's model with transformers (AutoConfig / AutoModelForCausalLM) without making
`import flashgla` import transformers.

`import flashgla` calls install(): when transformers is already imported, flashgla.models.hf is imported
(and registers) at once; otherwise a one-shot import hook waits for `import transformers` and registers
right after transformers' own package has loaded. Neither transformers nor its dependencies are
imported by flashgla when the program never imports transformers.
"""

import importlib.abc
import importlib.util
import sys
import warnings

_TARGET = "transformers"


def _register() -> None:
    try:
        from .models import hf  # noqa: F401  (importing it registers)
    except Exception as error:  # a transformers version flashgla's wrapper cannot work with
        warnings.warn(f"flashgla: could not register the 'flashgla_gla' model with transformers: {error!r}. "
                      "AutoModelForCausalLM will not know flashgla checkpoints; flashgla.models works as before.",
                      RuntimeWarning, stacklevel=2)


class _Loader(importlib.abc.Loader):
    """transformers' own loader, then the registration."""

    def __init__(self, inner):
        self._inner = inner

    def create_module(self, spec):
        return self._inner.create_module(spec)

    def exec_module(self, module):
        self._inner.exec_module(module)
        _register()

    def __getattr__(self, name):  # everything else (resources, is_package, ...) is transformers' loader's
        return getattr(self._inner, name)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name != _TARGET:
            return None
        uninstall()  # one shot; also keeps the lookup below from coming back here
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.loader is not None:
            spec.loader = _Loader(spec.loader)
        return spec


_finder = _Finder()


def install() -> None:
    if _TARGET in sys.modules:
        _register()
    elif _finder not in sys.meta_path:
        sys.meta_path.insert(0, _finder)


def uninstall() -> None:
    if _finder in sys.meta_path:
        sys.meta_path.remove(_finder)
