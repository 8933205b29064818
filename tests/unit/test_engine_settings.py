"""Engine settings reach the engine's configuration (inference.registry.engine_config)."""


def test_engine_config_takes_the_native_kernels_switch_from_settings(settings):
    from inference.registry import engine_config

    assert engine_config().native_kernels is True
    settings.INFERENCE_NATIVE_KERNELS = False
    assert engine_config().native_kernels is False
