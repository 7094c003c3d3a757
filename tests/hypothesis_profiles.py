"""Hypothesis settings profiles for the property tests.

``default`` keeps the CI run short; ``long`` is the soak run, selected with
``pytest --hypothesis-profile=long``.  Neither keeps an example database, so
a run leaves nothing behind in the tree; a failure prints the
``@reproduce_failure`` blob that replays it.
"""

try:
    from hypothesis import HealthCheck, Phase, settings
except ImportError:  # the property tests skip themselves without hypothesis
    settings = None

if settings is not None:
    _COMMON = dict(
        deadline=None,
        database=None,
        print_blob=True,
        # the explain phase writes patch files under .hypothesis/
        phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink],
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                               HealthCheck.filter_too_much],
    )
    # Registering "default" while it is the active profile makes it take effect.
    settings.register_profile("default", max_examples=150, **_COMMON)
    settings.register_profile("long", max_examples=5000, **_COMMON)
