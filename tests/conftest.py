import pytest

from ng_otel.cli.receiver import OtlpReceiver


@pytest.fixture
def otlp():
    """A real OTLP receiver (gRPC and HTTP) on 127.0.0.1, fresh for each test."""
    receiver = OtlpReceiver().start()
    yield receiver
    receiver.stop()
