"""Producer delivery accounting without a broker: deliveries to an address nothing listens on time out."""

from __future__ import annotations

import pytest

from distrl_stream.config import KafkaConfig
from distrl_stream.errors import DeliveryError
from distrl_stream.kafka.producer import Producer

UNREACHABLE = KafkaConfig(bootstrap_servers="127.0.0.1:1")


def test_a_failed_delivery_fails_one_flush_and_later_flushes_report_only_newer_failures() -> None:
    producer = Producer(UNREACHABLE, overrides={"message.timeout.ms": 300})
    try:
        producer.produce("metrics", b"lost in the outage")
        with pytest.raises(DeliveryError, match="1 messages failed delivery since the last flush") as lost:
            producer.flush(timeout_s=10)
        assert (lost.value.failed, lost.value.pending) == (1, 0)
        producer.flush(timeout_s=10)  # nothing failed since: the earlier loss was reported once
        producer.produce("weights", b"a")
        producer.produce("weights", b"b")
        with pytest.raises(DeliveryError, match=r"2 messages failed delivery since the last flush \(first: weights"):
            producer.flush(timeout_s=10)
        assert (producer.stats.produced, producer.stats.failed, producer.stats.delivered) == (3, 3, 0)
    finally:
        producer.close(timeout_s=0)
