// An open the server refused (a worker's offer or WebSocket, or the router's placement):
// its HTTP status and its error body ({ error, message, retry_after }).

export class OfferError extends Error {
  constructor(status, body) {
    super(body.message || `offer failed (${status})`);
    this.status = status;
    this.body = body;
  }
}
