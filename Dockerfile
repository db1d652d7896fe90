# Agent World: one image, embedded (SQLite) by default or distributed with REDIS_URL.
FROM python:3.11-slim
# bubblewrap: shell_exec and MCP servers run sandboxed (the container must allow user namespaces);
# slirp4netns and iproute2: a world that allows the network gets a network of its own, fenced off the host's.
RUN apt-get update && apt-get install -y --no-install-recommends bubblewrap slirp4netns iproute2 \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /app
COPY pyproject.toml README.md constraints.txt ./
COPY agent_world_client ./agent_world_client
COPY server ./server
COPY web ./web
COPY templates ./templates
COPY static ./static
# constraints.txt: the dependency versions CI tested, as ./dev installs them.
RUN pip install --no-cache-dir -c constraints.txt . && rm -rf agent_world_client server web templates static
VOLUME /data
EXPOSE 8000
CMD ["agent-world", "serve", "--host", "0.0.0.0", "--port", "8000", "--data-dir", "/data"]
