"""Seed-style modules written for these tests that use Amplifier's module API the way its own
tool and hook modules do (``async def mount(coordinator, config)``, ``coordinator.hooks``)."""
