"""The Board servicer: thin adapters from proto messages to BoardState.

Method names are the proto's. No error handling here: BpuEmuErrors propagate
to the ErrorInterceptor, which turns them into statuses.
"""
import logging
import queue
import threading
import time
from typing import Optional

import grpc

from bpuemu.common.errors import BpuEmuError, Cancelled, DeadlineExceeded, InvalidInput
from bpuemu.common.proto import board_pb2, board_pb2_grpc
from bpuemu.board.messages import (
    infer_reply, local_board_info, perf_config_from_request, perf_report_to_proto, request_inputs,
)
from bpuemu.board.daemon.state import BoardState
from bpuemu.board.daemon.store import OffsetMismatch, UploadIncomplete
from bpuemu.board.runtime.perf_job import run_perf

log = logging.getLogger("bpuemu.board.daemon")


class BoardService(board_pb2_grpc.BoardServicer):
    def __init__(self, state: BoardState, data_port: int = 0):
        self.state = state
        self.info = local_board_info()
        self.info.data_port = data_port

    def Handshake(self, request, context):
        self.state.check_client(request.api_version, request.client_version)
        # Caller-chosen strings: repr() keeps a newline in them from forging log lines.
        log.info("handshake from %r %r (%r, onnxruntime %r)", request.client_name[:64], request.client_version[:64],
                 request.client_arch[:64], request.client_onnxruntime_version[:64])
        return board_pb2.HandshakeReply(board=self.info)

    def HasModel(self, request, context):
        store = self.state.store
        present = store.has(request.sha256)
        return board_pb2.HasModelReply(present=present, loaded=self.state.is_loaded(request.sha256),
                                       partial_bytes=0 if present else store.partial_bytes(request.sha256))

    def UploadModel(self, request_iterator, context):
        request_iterator = _received(request_iterator, context, "upload")
        first = next(request_iterator, None)
        if first is None or first.WhichOneof("part") != "header":
            raise InvalidInput("an upload must start with an UploadHeader message")
        h = first.header
        try:
            upload = self.state.store.begin_upload(h.sha256, h.size, h.file_name, still_wanted=context.is_active,
                                                   offset=h.offset)
        except OffsetMismatch as mismatch:  # a resume from where the board is not: the client resumes from held
            return board_pb2.UploadReply(sha256=h.sha256, offset_mismatch=True, held_bytes=mismatch.held)
        if upload is None:
            return board_pb2.UploadReply(sha256=h.sha256, already_present=True)
        # The whole upload within its deadline, however slowly the chunks come (a stalled caller would
        # otherwise hold its upload slot and a worker thread): past it the call is cancelled.
        seconds = self.state.limits.transfer_s(max(0, h.size - h.offset))
        expired = threading.Event()
        timer = threading.Timer(seconds, self._expire, (context, f"upload of {h.sha256[:12]}", seconds, expired))
        timer.daemon = True
        timer.start()
        committed = False
        resumable = False  # kept for a resumed upload when the call ends under it, not when its bytes were wrong
        try:
            for chunk in request_iterator:
                if chunk.WhichOneof("part") != "data":
                    raise InvalidInput("only data chunks may follow the upload header")
                upload.write(chunk.data)
            upload.commit()
            committed = True
        except (Cancelled, DeadlineExceeded, UploadIncomplete):
            resumable = h.resumable
            if expired.is_set():  # the board's deadline ended the call, however its request stream then ended
                raise DeadlineExceeded(f"upload of {h.sha256[:12]} not done within the board's deadline "
                                       f"({seconds:.0f} s; hrt_boardd --call-deadline)") from None
            raise
        finally:
            timer.cancel()
            if not committed:
                upload.abort(keep=resumable)
        self.state.stats.add("uploads")
        log.info("stored model %s (%d bytes, %r)", h.sha256[:12], h.size, upload.file_name)
        return board_pb2.UploadReply(sha256=h.sha256, bytes_received=upload.received)

    @staticmethod
    def _expire(context, what: str, seconds: float, expired: Optional[threading.Event] = None) -> None:
        """End a call past the board's deadline: the caller gets DEADLINE_EXCEEDED saying so (``expired`` is set
        first, for the call's code to tell its end from a caller that went away or sent too little)."""
        if expired is not None:
            expired.set()
        message = f"{what} not done within the board's deadline ({seconds:.0f} s; hrt_boardd --call-deadline)"
        log.info("%s: cancelled", message)
        context.set_code(grpc.StatusCode.DEADLINE_EXCEEDED)  # what the metrics count
        try:  # the status and message the caller sees (gRPC's core call; context.cancel() would say CANCELLED)
            context._rpc_event.call.cancel(grpc.StatusCode.DEADLINE_EXCEEDED.value[0], message)
        except (AttributeError, TypeError):
            context.cancel()

    def LoadModel(self, request, context):
        loaded = self.state.load_as_job(request.sha256)
        return board_pb2.LoadModelReply(sha256=request.sha256, model_names=loaded.runtime.model_names)

    def UnloadModel(self, request, context):
        return board_pb2.UnloadModelReply(was_loaded=self.state.unload(request.sha256))

    def ListModels(self, request, context):
        reply = board_pb2.ListModelsReply()
        for m in self.state.store.list():
            reply.models.add(sha256=m.sha256, size=m.size, file_name=m.file_name,
                             loaded=self.state.is_loaded(m.sha256), model_names=self.state.loaded_names(m.sha256))
        return reply

    def GetModelInfo(self, request, context):
        model = self.state.load_as_job(request.sha256).binfile.model(request.model_name)
        return board_pb2.ModelInfoReply(model=model)

    def Infer(self, request, context):
        return infer_reply(self.state.infer(request.sha256, request.model_name, request_inputs(request), request.frame_count,
                                            request.dump_intermediate, context.is_active))

    def Perf(self, request, context):
        model = self.state.load_as_job(request.sha256, "perf").runtime.model(request.model_name)
        config = perf_config_from_request(request)
        config.validate(self.state.limits.max_frame_count, self.state.limits.max_perf_time_minutes)
        inputs = request_inputs(request)  # none: the runtime's seeded random inputs
        events: "queue.Queue" = queue.Queue()
        outcome = {}
        counted = [0]  # frames already added to the perf_frames count (at each progress tick)

        def progress(done, total, elapsed):
            self.state.stats.add("perf_frames", done - counted[0])
            counted[0] = done
            events.put(board_pb2.PerfEvent(progress=board_pb2.PerfProgress(frames_done=done, frames_total=total, elapsed_s=elapsed)))

        def work():
            try:
                outcome["report"] = run_perf(model, inputs, config, progress=progress,
                                             cancelled=lambda: not context.is_active())
            except BpuEmuError as exc:  # re-raised in the serving thread, without this thread's frames
                outcome["error"] = exc.with_traceback(None)
            except BaseException as exc:  # a bug: its traceback goes to the log
                outcome["error"] = exc
            finally:
                events.put(None)

        with self.state.job("perf"):
            self.state.stats.add("perf_jobs")
            # Not a daemon thread: a daemon exiting (SIGTERM, grace expired) must wait for the
            # job to see its cancelled context, not tear down onnxruntime under it (abort).
            worker = threading.Thread(target=work, name="perf-job")
            worker.start()
            try:
                while True:
                    event = events.get()
                    if event is None:
                        break
                    yield event
            finally:
                # Also when the caller went away mid-stream: the job stops within one progress
                # interval, and holds its slot until it has.
                worker.join()
        error = outcome.pop("error", None)
        if error is not None:
            try:
                raise error
            finally:
                # The error's traceback holds this frame and the job thread's (and through them the call's
                # gRPC context): unbound here, they are freed when the call ends, not by a later gc pass.
                del error, worker, outcome
        log.info("perf %s: %d frames, %.1f FPS", model.name, outcome["report"].frame_count, outcome["report"].fps)
        # The caller stops reading once it has the result, which cancels the stream: OK is set first, so
        # the call counts as done (the metrics), not as cancelled.
        context.set_code(grpc.StatusCode.OK)
        yield board_pb2.PerfEvent(result=perf_report_to_proto(outcome["report"]))

    def GetStats(self, request, context):
        return board_pb2.BoardStats(uptime_s=time.monotonic() - self.state.stats.started, jobs_running=self.state.jobs_running,
                                    rss_bytes=resident_bytes(), hostname=self.info.hostname, **self.state.stats.board_stats())


def _received(request_iterator, context, what: str):
    """A call's request messages; a BpuEmuError when the call ends under them (the caller went away, or the
    board's deadline passed) instead of gRPC's RpcError.

    gRPC keeps that RpcError in the call's state, and its traceback holds the frames that hold the call: a
    reference cycle that kept each such call (and its native memory) until a gc pass. Its traceback is
    dropped here.
    """
    try:
        yield from request_iterator
    except grpc.RpcError as err:
        err.with_traceback(None)
        if context.code() == grpc.StatusCode.DEADLINE_EXCEEDED:  # set by BoardService._expire
            raise DeadlineExceeded(f"{what} not done within the board's deadline (hrt_boardd --call-deadline)") from None
        raise Cancelled(f"{what} ended: the caller went away") from None


def resident_bytes() -> int:
    """This process's resident memory (VmRSS), 0 where /proc is not there."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0
