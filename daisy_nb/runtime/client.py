"""``daisy_nb.runtime.client``: a public path kept for programs that import it; the module is
:mod:`daisy_nb.runtime.net.client`. Standard library only, as the module it names."""

from daisy_nb.runtime.net.client import *  # noqa: F403
from daisy_nb.runtime.net.client import (  # noqa: F401  (what older programs and tests import from here)
    EXIT_CODE,
    EXIT_GRACE_SECS,
    GIVE_BACK_SECS,
    Client,
    _exit_settings,
    pack_block,
    pack_hello,
    pack_row,
    unpack_block,
    unpack_hello,
)
