package webhook

import (
	"strings"

	"gomodules.xyz/jsonpatch/v2"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func removeAnnotations(meta metav1.ObjectMeta, keys ...string) []jsonpatch.JsonPatchOperation {
	var ops []jsonpatch.JsonPatchOperation
	for _, k := range keys {
		if _, ok := meta.Annotations[k]; ok {
			ops = append(ops, jsonpatch.JsonPatchOperation{Operation: "remove", Path: pointer("metadata", "annotations", k)})
		}
	}
	return ops
}

func removeLabels(meta metav1.ObjectMeta, keys ...string) []jsonpatch.JsonPatchOperation {
	var ops []jsonpatch.JsonPatchOperation
	for _, k := range keys {
		if _, ok := meta.Labels[k]; ok {
			ops = append(ops, jsonpatch.JsonPatchOperation{Operation: "remove", Path: pointer("metadata", "labels", k)})
		}
	}
	return ops
}

func setAnnotation(meta metav1.ObjectMeta, key, value string) jsonpatch.JsonPatchOperation {
	if meta.Annotations == nil {
		return jsonpatch.JsonPatchOperation{Operation: "add", Path: "/metadata/annotations", Value: map[string]string{key: value}}
	}
	return jsonpatch.JsonPatchOperation{Operation: "add", Path: pointer("metadata", "annotations", key), Value: value}
}

// pointer is the JSON pointer (RFC 6901) to the member named by keys, for a
// patch: "~" and "/" inside a key, as in a label or annotation name, are
// escaped.
func pointer(keys ...string) string {
	var b strings.Builder
	for _, k := range keys {
		b.WriteString("/")
		b.WriteString(pointerEscape.Replace(k))
	}
	return b.String()
}

var pointerEscape = strings.NewReplacer("~", "~0", "/", "~1")
