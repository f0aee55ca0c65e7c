"""The Executor agent: tool-call protocol, tools and registry, the multi-turn loop, prompts
shared by train and serve.

    from mia.agent import ChatPolicy, ExecutorLoop, build_tools, load_agent_config

    cfg = load_agent_config("configs/agent/default.yaml")
    loop = ExecutorLoop(ChatPolicy(backend), build_tools(cfg.tools), cfg)
    traj = await loop.run({"question": "...", "plan": "..."})
    traj = await loop.continue_with_plan(traj, "revised plan ...")

Training uses ``TokenPolicy(local_chat)`` for exact token ids, masks and logprobs.
"""

from __future__ import annotations

from mia.agent.config import AgentConfig, default_tools, load_agent_config
from mia.agent.loop import ExecutorLoop, ExecutorTask, ReplanLimitError, sampling_for
from mia.agent.policy import ChatPolicy, Generation, Injection, Policy, TokenPolicy
from mia.agent.protocol import FormatCheck, ParsedTurn, ToolCall, check_format, parse_turn
from mia.agent.tools import (
    TOOL_TYPES,
    ImageSearchTool,
    SearchTool,
    Tool,
    ToolArgumentError,
    ToolConfigError,
    ToolContext,
    ToolOutput,
    ToolServiceError,
    ToolSet,
    build_tool,
    build_tools,
    register_tool,
)
from mia.agent.trajectory import Attempt, Segment, ToolCallRecord, Trajectory

__all__ = [
    "TOOL_TYPES",
    "AgentConfig",
    "Attempt",
    "ChatPolicy",
    "ExecutorLoop",
    "ExecutorTask",
    "FormatCheck",
    "Generation",
    "ImageSearchTool",
    "Injection",
    "ParsedTurn",
    "Policy",
    "ReplanLimitError",
    "SearchTool",
    "Segment",
    "TokenPolicy",
    "Tool",
    "ToolArgumentError",
    "ToolCall",
    "ToolCallRecord",
    "ToolConfigError",
    "ToolContext",
    "ToolOutput",
    "ToolServiceError",
    "ToolSet",
    "Trajectory",
    "build_tool",
    "build_tools",
    "check_format",
    "default_tools",
    "load_agent_config",
    "parse_turn",
    "register_tool",
    "sampling_for",
]
