"""A QP's posting path, compiled with the protocol cores: what :meth:`QP.post_send` and
:meth:`QP.post_recv` run.

In libibverbs ``ibv_post_send`` is an inline call into the provider's ops: the work request is
written to the QP and the doorbell rung, with no layer between.  Here the same two steps - the
NIC core's post, then the driver's kick (the engine node's, or the pump's) - are one native
call, so the collectives' link ends (compiled as well) post every chunk and every credit with
no interpreted frame between them and the NIC core.  One per QP: three references.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from mypy_extensions import mypyc_attr

from rocev2_emu.nic.core import NicCore
from rocev2_emu.transport.qp import QueuePair
from rocev2_emu.transport.work import RecvWR, SendWR


@mypyc_attr(allow_interpreted_subclasses=True)
class Doorbell:
    """Posts to ``qp`` of ``core`` and rings the driver (``kick``) after each call.  (A test
    may subclass it to break a post: :meth:`QP.post_send` builds it by this module's name.)"""

    def __init__(self, core: NicCore, qp: QueuePair, kick: Callable[[], None]) -> None:
        self.core = core
        self.qp = qp
        self.kick = kick

    def post_send(self, wr: SendWR) -> None:
        self.core.post_send(self.qp, wr)
        self.kick()

    def post_sends(self, wrs: Sequence[SendWR]) -> None:
        """Each in order, then one kick (a bad one raises; those before it are posted)."""
        core, qp = self.core, self.qp
        for wr in wrs:
            core.post_send(qp, wr)
        self.kick()

    def post_recv(self, wr: RecvWR) -> None:
        self.core.post_recv(self.qp, wr)
        self.kick()

    def post_recvs(self, wrs: Sequence[RecvWR]) -> None:
        core, qp = self.core, self.qp
        for wr in wrs:
            core.post_recv(qp, wr)
        self.kick()
