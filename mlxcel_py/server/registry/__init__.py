"""Several models behind one server: the registry of configured models and its routes."""

from .hosted import LOADED, LOADING, UNLOADED, Hosted
from .loading import while_loading
from .registry import ModelRegistry
from .routes import ModelNameRequest, load_model_route, unload_model_route

__all__ = ["LOADED", "LOADING", "UNLOADED", "Hosted", "ModelNameRequest", "ModelRegistry", "load_model_route", "unload_model_route",
           "while_loading"]
