"""Fake of Kunlun's ``torch_xmlir``: only ``_XMLIRC._xpu_get_devices_number()``.

The device count comes from ``FAKE_XMLIR_DEVICES`` (default 8, as on a P800 host), so a
subprocess can be given any count.
"""

import os


class _XMLIRC:
    @staticmethod
    def _xpu_get_devices_number() -> int:
        return int(os.environ.get("FAKE_XMLIR_DEVICES", "8"))
