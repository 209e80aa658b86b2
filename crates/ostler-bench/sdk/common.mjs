// Helpers of the TypeScript SDK scripts (firehose.mjs, latency.mjs).

// A user message as the SDK's streaming input takes it.
export const user = (content) => ({
  type: "user",
  message: { role: "user", content },
  parent_tool_use_id: null,
  session_id: "",
});

// A promise and the function that resolves it.
export const deferred = () => {
  let resolve;
  const promise = new Promise((r) => (resolve = r));
  return { promise, resolve };
};
