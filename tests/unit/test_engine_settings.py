"""Engine settings reach the engine's configuration (inference.registry.engine_config)."""

import pytest
from django.core.exceptions import ImproperlyConfigured


def test_engine_config_takes_the_native_kernels_switch_from_settings(settings):
    from inference.registry import engine_config

    assert engine_config().native_kernels is True
    settings.INFERENCE_NATIVE_KERNELS = False
    assert engine_config().native_kernels is False


def test_engine_config_takes_the_kernel_memory_setting_and_refuses_other_values(settings):
    from inference.registry import engine_config

    assert engine_config().kernel_memory == "fast"
    settings.INFERENCE_KERNEL_MEMORY = "low"
    assert engine_config().kernel_memory == "low"
    settings.INFERENCE_KERNEL_MEMORY = "small"
    with pytest.raises(ImproperlyConfigured, match="INFERENCE_KERNEL_MEMORY"):
        engine_config()


def test_engine_config_takes_the_kv_memory_target_from_settings(settings):
    from inference.registry import engine_config

    assert engine_config().kv_cache_memory_mb == 384.0
    settings.INFERENCE_KV_CACHE_MEMORY_MB = 0
    assert engine_config().kv_cache_memory_mb == 0
    settings.INFERENCE_KV_CACHE_MEMORY_MB = -1
    assert engine_config().kv_cache_memory_mb is None  # no target
    settings.INFERENCE_KV_CACHE_MEMORY_MB = -5
    with pytest.raises(ImproperlyConfigured, match="INFERENCE_KV_CACHE_MEMORY_MB"):
        engine_config()
