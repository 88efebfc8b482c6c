"""The SDK's public import: ``from basalt.client import Producer, PushConsumer,
LitePullConsumer, Message``."""

from __future__ import annotations

import basalt.client
import basalt.common.message


def test_the_public_import_names_the_shared_message() -> None:
    from basalt.client import LitePullConsumer, Message, Producer, PushConsumer

    assert Message is basalt.common.message.Message
    assert {"Producer", "PushConsumer", "LitePullConsumer", "Message"} <= set(basalt.client.__all__)
    assert (Producer, PushConsumer, LitePullConsumer) == (
        basalt.client.Producer,
        basalt.client.PushConsumer,
        basalt.client.LitePullConsumer,
    )
