// @solana/kit's Solana RPC client on the gateway's JSON-RPC endpoint as its RPC URL, with
// @x402/fetch (exact SVM scheme, sign-in-with-x hook) as its transport. Run by
// tests/test_rpc_endpoint_js.py from a directory where the packages are installed:
//   node kit_rpc_endpoint.mjs exact|credit ACCOUNT
// exact: every request is paid once; credit: a top-up buys credit, a credit session is opened,
// and the transport adds its token in X-CREDIT-SESSION; then kit's own HTTP transport
// (createSolanaRpc with the header) calls on it, and the session is ended. Prints one JSON object.
import { readFileSync } from "node:fs";
import { createKeyPairSignerFromBytes, createSolanaRpc, createSolanaRpcFromTransport } from "@solana/kit";
import { createSIWxClientHook } from "@x402/extensions/sign-in-with-x";
import { wrapFetchWithPayment, x402Client, x402HTTPClient } from "@x402/fetch";
import { ExactSvmScheme, toClientSvmSigner } from "@x402/svm";

const [mode, account] = process.argv.slice(2);
const gateway = process.env.GATEWAY;
const endpoint = `${gateway}/v1/x402/solana/mainnet/provider_a/rpc`;
const secret = new Uint8Array(JSON.parse(readFileSync(process.env.X402_KEYPAIR, "utf8")));
const keypair = await createKeyPairSignerFromBytes(secret);
const client = new x402Client().register(
  "solana:*",
  new ExactSvmScheme(toClientSvmSigner(keypair), { rpcUrl: process.env.SOLANA_RPC_URL }),
);
const fetchWithPayment = wrapFetchWithPayment(
  fetch,
  new x402HTTPClient(client).onPaymentRequired(createSIWxClientHook(keypair)),
);

const headers = { "content-type": "application/json" };
const requests = []; // what each HTTP request sent and what came back
if (mode === "credit") {
  const topUp = await fetchWithPayment(`${gateway}/v1/x402/credits/top-up/1`, { method: "POST" });
  const bought = (await topUp.json()).result.balanceMicroUsdc;
  const session = await fetchWithPayment(`${gateway}/v1/x402/credits/sessions?capMicroUsdc=100000`, {
    method: "POST",
  });
  headers["x-credit-session"] = (await session.json()).result.token;
  requests.push({ topUp: topUp.status, bought, session: session.status });
}

/** One HTTP request through the x402 fetch: a JSON-RPC call or a batch of them. */
async function post(body, signal) {
  const response = await fetchWithPayment(endpoint, {
    method: "POST",
    headers,
    body: JSON.stringify(body),
    signal,
  });
  const settlement = response.headers.get("payment-response");
  requests.push({
    methods: [body].flat().map((call) => call.method),
    status: response.status,
    settled: settlement && JSON.parse(Buffer.from(settlement, "base64").toString()).success,
    creditBalance: response.headers.get("x-credit-balance"),
  });
  return response.json();
}

// Kit has no batch API: its transport is handed one call at a time. This transport sends the
// calls made in the same tick as one JSON-RPC batch (a single call stays a single call).
let pending = [];
function transport({ payload, signal }) {
  return new Promise((resolve, reject) => {
    pending.push({ payload, resolve, reject });
    if (pending.length > 1) return;
    setTimeout(async () => { // after every call made in this tick
      const calls = pending;
      pending = [];
      try {
        if (calls.length === 1) return calls[0].resolve(await post(calls[0].payload, signal));
        const answers = await post(calls.map((c, i) => ({ ...c.payload, id: String(i) })), signal);
        if (!Array.isArray(answers)) throw new Error(JSON.stringify(answers));
        calls.forEach((c, i) => c.resolve({ ...answers.find((a) => a.id === String(i)), id: c.payload.id }));
      } catch (error) {
        calls.forEach((c) => c.reject(error));
      }
    }, 0);
  });
}

const rpc = createSolanaRpcFromTransport(transport);
const balance = await rpc.getBalance(account).send();
const info = await rpc.getAccountInfo(account, { encoding: "base64" }).send();
const [batchBalance, batchInfo] = await Promise.all([
  rpc.getBalance(account).send(),
  rpc.getAccountInfo(account, { encoding: "base64" }).send(),
]);
let plain = null;
if (mode === "credit") {
  // A session needs no x402 client at all: kit's own HTTP transport, the header in its config.
  const sessionRpc = createSolanaRpc(endpoint, { headers: { "x-credit-session": headers["x-credit-session"] } });
  plain = (await sessionRpc.getBalance(account).send()).value.toString();
  // Ending the session says what it spent: proof the calls ran on it, not on a sign-in each.
  const revoked = await fetch(`${gateway}/v1/x402/credits/sessions`, {
    method: "DELETE",
    headers: { "x-credit-session": headers["x-credit-session"] },
  });
  requests.push({ revoked: revoked.status, spent: (await revoked.json()).result.spentMicroUsdc });
}
console.log(
  JSON.stringify({
    balance: balance.value.toString(),
    balanceType: typeof balance.value,
    owner: info.value.owner,
    lamports: info.value.lamports.toString(),
    batch: [batchBalance.value.toString(), batchInfo.value.owner],
    plain,
    requests,
  }),
);
