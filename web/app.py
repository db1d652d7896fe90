"""The web app's routes, mounted beside the API through the `agent_world.extensions` entry point."""
from __future__ import annotations

from starlette.routing import BaseRoute, Mount, Route, WebSocketRoute
from starlette.staticfiles import StaticFiles

from . import files, inbox, manage, mcp_sign_in, network, notifications, pages, push, retry, versions
from .live import page_socket
from .render import STATIC, compile_templates, render

_TITLES = {400: "That did not work", 401: "Not signed in", 403: "Not allowed", 404: "Not found",
           409: "Changed meanwhile", 503: "Storage unavailable"}


def error_page(status: int, message: str) -> str:
    """An error as a page of the site (its layout, theme and styles); server/app.py finds it by entry point."""
    return render("error.html", status=status, title=_TITLES.get(status, f"Error {status}"), message=message)


def routes() -> list[BaseRoute]:
    compile_templates()  # at start, not on the loop at each template's first use
    w = "/w/{world}"
    return [
        Route("/", pages.world_list, methods=["GET"]),
        Route("/login", pages.login_page, methods=["GET"]),  # the POST that signs in is the server's
        Route("/inbox", inbox.inbox_page, methods=["GET"]),
        Route("/sw.js", push.service_worker, methods=["GET"]),
        WebSocketRoute("/inbox/ws", inbox.inbox_socket),
        Route("/worlds", pages.create_world, methods=["POST"]),
        Route(w, pages.world_page, methods=["GET"]),
        Route(f"{w}/audit", pages.audit, methods=["GET"]),
        Route(f"{w}/settings", pages.settings_page, methods=["GET"]),
        Route(f"{w}/files", files.listing, methods=["GET"]),
        Route(f"{w}/files/preview", files.preview, methods=["GET"]),
        Route(f"{w}/agents", manage.add_agent, methods=["POST"]),
        Route(f"{w}/agents/{{name}}/remove", manage.remove_agent, methods=["POST"]),
        Route(f"{w}/agents/{{name}}/test", manage.test_agent, methods=["POST"]),
        Route(f"{w}/agents/{{name}}/retry", retry.retry, methods=["POST"]),
        Route(f"{w}/messages/{{seq}}/edit", versions.edit, methods=["POST"]),
        Route(f"{w}/chats/{{chat}}/branch", versions.branch, methods=["POST"]),
        Route(f"{w}/models", manage.models, methods=["POST"]),
        Route(f"{w}/settings", manage.save_settings, methods=["POST"]),
        Route(f"{w}/webhooks", notifications.save_webhook, methods=["POST"]),
        Route(f"{w}/webhooks/deliveries", notifications.recent_deliveries, methods=["GET"]),
        Route(f"{w}/webhooks/{{id}}", notifications.save_webhook, methods=["POST"]),
        Route(f"{w}/webhooks/{{id}}/remove", notifications.remove_webhook, methods=["POST"]),
        Route(f"{w}/escalation", notifications.save_escalation, methods=["POST"]),
        Route(f"{w}/mcp", manage.add_mcp, methods=["POST"]),
        Route(f"{w}/mcp/{{name}}", manage.edit_mcp, methods=["POST"]),
        Route(f"{w}/mcp/{{name}}/remove", manage.remove_mcp, methods=["POST"]),
        Route(f"{w}/mcp/{{name}}/state", manage.mcp_state, methods=["GET"]),
        Route(f"{w}/mcp/{{name}}/sign-in", mcp_sign_in.sign_in, methods=["POST"]),
        Route(f"{w}/mcp/{{name}}/sign-out", mcp_sign_in.sign_out, methods=["POST"]),
        Route(f"{w}/chats/{{chat}}/rename", manage.rename_chat, methods=["POST"]),
        Route(f"{w}/chats/{{chat}}/delete", manage.delete_chat, methods=["POST"]),
        Route(f"{w}/invites/{{item}}/revoke", manage.revoke_invite, methods=["POST"]),
        Route(f"{w}/agents/{{name}}", manage.update_agent, methods=["POST"]),
        Route(f"{w}/chats", pages.create_chat, methods=["POST"]),
        Route(f"{w}/rules", manage.add_rule, methods=["POST"]),
        Route(f"{w}/rules/package-registries", network.add_package_registries, methods=["POST"]),
        Route(f"{w}/rules/{{item}}/revoke", pages.revoke_rule, methods=["POST"]),
        Route(f"{w}/grants/{{item}}/revoke", pages.revoke_grant, methods=["POST"]),
        Route(f"{w}/invites", pages.invite, methods=["POST"]),
        WebSocketRoute(f"{w}/ws", page_socket),
        Mount("/static", StaticFiles(directory=str(STATIC)), name="static"),
    ]
